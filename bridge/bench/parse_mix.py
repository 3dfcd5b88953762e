"""The frames ``lakegate bench parse`` measures on (:mod:`bridge.bench.parse`):
a batch of a realistic MQTT 5 mix, made vectorised in a second or two.

The mix: 98.4 % PUBLISH (QoS 0/1/2 = 50/40/10 %, topics of 20-60 bytes drawn
from 65,536 distinct topics, payloads of 10 B-4 KiB log-uniform -- text when
the Payload Format Indicator is 1, else half text half binary -- and 0-4 of
the PUBLISH properties, 2 % of them using a Topic Alias with an empty Topic
Name), 1.5 % PUBACK/PUBREC/PUBREL/PUBCOMP, 0.1 % CONNECT/SUBSCRIBE/
DISCONNECT; about 3 % of the PUBLISH frames break a rule (QoS 3, a record cut
short, a wildcard or bad UTF-8 in the topic, a broken property block, packet
id 0, a non-UTF-8 payload with Payload Format Indicator 1).
"""

from __future__ import annotations

import numpy as np

__all__ = ["generate"]


def _pool(pieces: list[bytes]):
    """(buffer, numpy data, starts, lengths) of byte strings stored back to back."""
    import pyarrow as pa

    lengths = np.array([len(x) for x in pieces], dtype=np.int64)
    starts = np.zeros(len(pieces), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    buf = pa.py_buffer(b"".join(pieces) or b"\0")
    return buf, np.frombuffer(buf, dtype=np.uint8), starts, lengths


def _property_blocks(rng, count: int):
    """Encoded MQTT 5 PUBLISH property blocks with 0-4 properties, and their
    Payload Format Indicator (-1 when absent). Built with the codec (a few
    thousand, once)."""
    from bridge.mqtt.properties import Properties, Scope, encode_properties

    blocks, pfi = [], []
    kinds = ["pfi", "expiry", "content_type", "response_topic", "correlation", "user", "user"]
    for _ in range(count):
        k = int(rng.integers(0, 5))
        chosen = rng.choice(len(kinds), size=k, replace=False)
        fields: dict = {}
        users = []
        for c in chosen.tolist():
            kind = kinds[c]
            if kind == "pfi":
                fields["payload_format_indicator"] = int(rng.integers(0, 2))
            elif kind == "expiry":
                fields["message_expiry_interval"] = int(rng.integers(1, 86400))
            elif kind == "content_type":
                fields["content_type"] = ["application/json", "text/plain", "application/cbor"][c % 3]
            elif kind == "response_topic":
                fields["response_topic"] = f"reply/{int(rng.integers(0, 10**6))}"
            elif kind == "correlation":
                fields["correlation_data"] = rng.bytes(int(rng.integers(4, 17)))
            else:
                users.append((f"k{int(rng.integers(0, 100))}", f"value-{int(rng.integers(0, 10**6))}"))
        blocks.append(encode_properties(Properties(user_properties=users, **fields), Scope.PUBLISH))
        pfi.append(fields.get("payload_format_indicator", -1))
    return blocks, np.array(pfi, dtype=np.int64)


_BAD_BLOCKS = [
    b"\x02\x2f\x00",                          # unknown property identifier
    b"\x04\x01\x01\x01\x00",                  # Payload Format Indicator twice
    b"\x02\x12\x00",                          # Assigned Client Identifier: not in PUBLISH
    b"\x03\x02\x00\x00",                      # Message Expiry Interval of the wrong size
    b"\x07\x26\x00\x01\xff\x00\x01a",         # User Property name not UTF-8
    b"\x02\x01\x02",                          # Payload Format Indicator 2
    b"\x03\x23\x00\x00",                      # Topic Alias 0
]
_BAD_TOPICS = [b"sensors/+/temperature/room-1", b"sensors/#", b"site/\xff\xfe/x/yyyyyyyyyyy",
               b"site/a\x00b/ccccccccccccccc", b"site/\xed\xa0\x80/surrogate/xxxxxx"]


def generate(n: int, seed: int = 7):
    """``(frames, levels, alias_topics)``: a large_binary array of ``n``
    frames of the mix in the module docstring, all protocol level 5, and the
    capture's resolved alias topics. Vectorised: every piece of every frame
    (fixed header, topic, packet id, property block, payload) is cut from a
    pool with one Arrow copy, and the pieces are joined per row in C++."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from bridge.mqtt import Connect, Disconnect, PubAck, PubComp, PubRec, PubRel, Subscribe, encode
    from bridge.mqtt import Properties, Subscription
    from bridge.parse.buffers import take_ranges

    rng = np.random.default_rng(seed)
    kind = rng.choice(3, size=n, p=[0.984, 0.015, 0.001])  # PUBLISH, ack, rare
    pub = kind == 0
    bad = pub & (rng.random(n) < 0.03)
    bad_kind = np.where(bad, rng.integers(0, 6, n), -1)

    # topics: 65,536 distinct, 20-60 bytes, with their two-byte length
    k = 65536
    tl = rng.integers(20, 61, k)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789-_", dtype=np.uint8)
    mat = alphabet[rng.integers(0, len(alphabet), (k, 62))]
    mat[:, 2:][:, 6::9] = ord("/")
    mat[:, 0] = tl >> 8
    mat[:, 1] = tl & 0xFF
    keep = np.arange(62) < (tl + 2)[:, None]
    pieces_t = [bytes(x) for x in np.split(mat[keep], np.cumsum(tl + 2)[:-1])]
    pieces_t += [len(b).to_bytes(2, "big") + b for b in _BAD_TOPICS] + [b"\x00\x00"]
    tbuf, tdata, tstart, tlen = _pool(pieces_t)
    topic = rng.integers(0, k, n)
    alias_use = pub & ~bad & (rng.random(n) < 0.02)
    topic = np.where(alias_use, len(pieces_t) - 1, topic)
    topic = np.where(bad_kind == 2, k + rng.integers(0, len(_BAD_TOPICS), n), topic)

    # property blocks
    blocks, pfi = _property_blocks(rng, 4096)
    alias_block = len(blocks)
    blocks.append(b"\x03\x23\x00\x05")  # Topic Alias 5
    text_block = len(blocks)
    blocks.append(b"\x02\x01\x01")  # Payload Format Indicator 1
    first_bad = len(blocks)
    blocks += _BAD_BLOCKS
    pfi = np.concatenate([pfi, [-1, 1], np.full(len(_BAD_BLOCKS), -1)])
    bbuf, bdata, bstart, blen = _pool(blocks)
    block = rng.integers(0, 4096, n)
    block = np.where(alias_use, alias_block, block)
    block = np.where(bad_kind == 3, first_bad + rng.integers(0, len(_BAD_BLOCKS), n), block)
    block = np.where(bad_kind == 5, text_block, block)

    # payloads: 10 B - 4 KiB, log-uniform; text or binary pools of 8 MiB
    plen = np.exp(rng.uniform(np.log(10), np.log(4096), n)).astype(np.int64)
    pool = 8 << 20
    text = np.frombuffer(b'{"t": 21.5, "id": "abc", "ok": true}\n', dtype=np.uint8)
    payload_pool = np.concatenate([np.resize(text, pool), rng.integers(0, 256, pool, dtype=np.uint8)])
    pbuf = pa.py_buffer(payload_pool)
    is_text = (pfi[block] == 1) | (rng.random(n) < 0.5)
    is_text &= bad_kind != 5
    pstart = rng.integers(0, pool - 4096, n) + np.where(is_text, 0, pool)
    pstart = np.where(is_text, pstart - pstart % len(text), pstart)  # text starts on a record

    qos = rng.choice(3, size=n, p=[0.5, 0.4, 0.1])
    qos = np.where(bad_kind == 4, 1, qos)
    pid = rng.integers(1, 65536, n)
    pid = np.where(bad_kind == 4, 0, pid)
    dup = (qos > 0) & (rng.random(n) < 0.02)
    retain = rng.random(n) < 0.05
    first = 0x30 | (dup << 3) | (qos << 1) | retain
    first = np.where(bad_kind == 0, first | 0x06, first)
    pidlen = np.where(qos > 0, 2, 0)
    rl = tlen[topic] + pidlen + blen[block] + plen
    cut = (bad_kind == 1).astype(np.int64)  # the record ends one byte early

    # fixed header: byte 1 + Remaining Length
    hdr = np.zeros((n, 5), dtype=np.uint8)
    hdr[:, 0] = first
    hlen = np.ones(n, dtype=np.int64)
    v = rl.copy()
    for i in range(1, 5):
        more = v > 0x7F
        hdr[:, i] = (v & 0x7F) | (more << 7)
        hlen += (v > 0) | (i == 1)
        v >>= 7
        if not more.any():
            break
    pidb = np.zeros((n, 2), dtype=np.uint8)
    pidb[:, 0] = pid >> 8
    pidb[:, 1] = pid & 0xFF
    hbuf = pa.py_buffer(hdr)
    idbuf = pa.py_buffer(pidb)
    rows = np.arange(n, dtype=np.int64)
    m = pub
    parts = [
        take_ranges(hbuf, np.frombuffer(hbuf, np.uint8), rows * 5, np.where(m, hlen, 0)),
        take_ranges(tbuf, tdata, tstart[topic], np.where(m, tlen[topic], 0)),
        take_ranges(idbuf, np.frombuffer(idbuf, np.uint8), rows * 2, np.where(m, pidlen, 0)),
        take_ranges(bbuf, bdata, bstart[block], np.where(m, blen[block], 0)),
        take_ranges(pbuf, payload_pool, pstart, np.where(m, plen - cut, 0)),
    ]
    # acknowledgements and rare types: whole frames from small pools
    others = [encode(cls(packet_id=p, reason_code=rc, properties=Properties(
        reason_string="ok" if rs else None)), 5)
        for cls in (PubAck, PubRec, PubRel, PubComp) for p in (1, 99, 65535)
        for rc, rs in ((0, False), (0x10 if cls in (PubAck, PubRec) else 0x92, False), (0, True))]
    n_acks = len(others)
    others += [
        encode(Connect.for_level(5, client_id="sensor-0042", keepalive=60), 5),
        encode(Subscribe(packet_id=7, subscriptions=[Subscription("cmd/sensor-0042/#", qos=1)]), 5),
        encode(Disconnect(), 5),
    ]
    obuf, odata, ostart, olen = _pool(others)
    which = np.where(kind == 1, rng.integers(0, n_acks, n), n_acks + rng.integers(0, 3, n))
    parts.append(take_ranges(obuf, odata, ostart[which], np.where(m, 0, olen[which])))
    frames = pc.binary_join_element_wise(*parts, b"").cast(pa.large_binary())
    alias = pa.array(np.where(alias_use, "alias/resolved/by/the/edge", None), type=pa.string())
    return frames, np.full(n, 5, dtype=np.int64), alias
