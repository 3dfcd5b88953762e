"""Run the client ``send`` payloads of the Mosquitto conformance vectors
through the codec (no server, no sockets).

For every vector the protocol level comes from ``ver`` (or from the CONNECT
the vector sends itself). Each send is decoded; then:

* a send followed by ``recv E0 01 XX`` (MQTT 5 DISCONNECT) must raise an
  error whose reason code is XX, unless the vector is a documented deviation
  (``rules.VECTOR_DEVIATIONS``: then our rule must be the one raised);
* a send followed by a CONNACK refusal must raise an error whose reason maps
  to that CONNACK (``connack_v3_code`` in 3.x);
* a send followed by any other recv must decode;
* the last send of an ``expect_disconnect`` vector must raise, or decode to
  a DISCONNECT (the client closes), or be listed in ``SESSION`` with the rule
  the session layer raises -- those need connection state the codec does not
  keep, and where the codec offers a helper the test calls it;
* a vector with ``expect_disconnect: false`` must decode throughout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.mqtt import (
    Connect, Disconnect, MqttError, check_client_id, check_topic_alias,
    decode_packet,
)
from bridge.mqtt.reason_codes import connack_v3_code
from bridge.mqtt.rules import RULES, VECTOR_DEVIATIONS

VECTORS = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "mosquitto-vectors"
FILES = ["CONNECT", "CONNACK", "PUBLISH", "PUBACK", "PUBREC", "PUBREL", "PUBCOMP", "SUBSCRIBE",
         "SUBACK", "UNSUBSCRIBE", "UNSUBACK", "PINGREQ", "PINGRESP", "DISCONNECT", "AUTH",
         "FORBIDDEN", "REGRESSION"]


def _tap(fn):
    """Turn a helper call into 'the session raises': return the error."""
    def run(packet):
        with pytest.raises(MqttError) as info:
            fn(packet)
        return info.value
    return run


# (file, ver, vector name) -> (rule the session layer raises, helper check or None)
SESSION = {
    ("CONNECT.json", 3, "10 empty client ID"): ("MQTT-3.1.3-8", _tap(check_client_id)),
    ("CONNECT.json", 4, "10 empty client ID clean false [MQTT-3.1.3-7]"):
        ("MQTT-3.1.3-8", _tap(check_client_id)),
    ("CONNECT.json", 4, "10 [MQTT-3.1.0-2]"): ("MQTT-3.1.0-2", None),
    ("CONNECT.json", 4, "duplicate CONNECT"): ("MQTT-3.1.0-2", None),
    ("CONNECT.json", 4, "NanoMQ CWE-119"): ("MQTT-3.1.0-2", None),
    # CONNECT with Maximum Packet Size 2: no CONNACK fits; the server must not
    # send it [MQTT-3.1.2-24] and closes.
    ("CONNECT.json", 5, "tiny max packet"): ("MQTT-3.1.2-24", None),
    # Authentication methods are the session's (or an auth plugin's) business.
    ("CONNECT.json", 5, "unsupported authentication method"): (None, None),
    ("PUBLISH.json", 5, "topic alias > max topic alias"):
        ("MQTT-3.3.2-9", _tap(lambda p: check_topic_alias(p, 10))),
    ("DISCONNECT.json", 5, "E0 non-zero session expiry"):
        ("LG-disconnect-session-expiry", None),
}
# Rules the session raises for state these vectors do not exercise (named so
# that the rule table's test coverage check sees them).
SESSION_ONLY_RULES = ["MQTT-3.2.2-11", "MQTT-3.2.2-14", "MQTT-3.3.4-7", "LG-topic-alias-unmapped",
                      "MQTT-4.12.0-7", "MQTT-3.3.2-11"]

DEVIATIONS = {(d.file, 5, name): d for d in VECTOR_DEVIATIONS for name in d.names}


def _hex(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


def _load():
    if not VECTORS.is_dir():
        return []
    out = []
    for stem in FILES:
        name = f"{stem}.json"
        for group in json.loads((VECTORS / name).read_text()):
            for test in group["tests"]:
                out.append(pytest.param(name, group["group"], test,
                                        id=f"{name}:{group['group'].strip()}:"
                                           f"{test['name'].strip()}"))
    return out


CASES = _load()


def _group_level(group: str, test: dict) -> int:
    """The protocol level a vector speaks: its ``ver``, else its group's version."""
    if "ver" in test:
        return test["ver"]
    for prefix, level in (("v3.1.1", 4), ("v3.1", 3), ("v5.0", 5)):
        if group.startswith(prefix):
            return level
    return 4


def _decode_all(data: bytes, level):
    """Decode every frame of one send; returns (packets, error or None)."""
    packets = []
    view = memoryview(data)
    while view:
        try:
            packet, used = decode_packet(view, level)
        except MqttError as err:
            return packets, err
        packets.append(packet)
        if isinstance(packet, Connect):
            level = packet.protocol_level
        view = view[used:]
    return packets, None


@pytest.mark.skipif(not CASES, reason=f"conformance vectors not present at {VECTORS}")
@pytest.mark.parametrize("file, group, test", CASES)
def test_vector(file, group, test):
    ver = _group_level(group, test)
    key = (file, ver, test["name"])
    level = ver if test.get("connect", True) else None
    msgs = [m for m in test["msgs"] if m["type"] in ("send", "recv")]
    sends = [i for i, m in enumerate(msgs) if m["type"] == "send"]
    deviation = DEVIATIONS.get(key)
    session = SESSION.get(key)
    packets, error = [], None
    deviated = False
    for i in sends:
        packets, error = _decode_all(_hex(msgs[i]["payload"]), level)
        for p in packets:
            if isinstance(p, Connect):
                level = p.protocol_level
        last = i == sends[-1]
        reply = _hex(msgs[i + 1]["payload"]) if i + 1 < len(msgs) and \
            msgs[i + 1]["type"] == "recv" else None
        if session is not None and last:
            _check_session(session, packets, error, reply)
            return
        if deviation is not None:
            # The standard overrules this vector: our rule, not its reason.
            if error is None and deviation.vector_reason == 0:
                pytest.fail(f"deviation {deviation.our_rule} expected, decoded {packets}")
            if error is not None and error.rule == deviation.our_rule:
                assert reply is None or deviation.vector_reason in (0, reply[-1])
                deviated = True
                continue
        if reply is None:
            continue
        if reply[0] == 0xE0 and len(reply) == 3:  # MQTT 5 DISCONNECT with a reason code
            assert error is not None, f"expected DISCONNECT 0x{reply[2]:02X}, decoded {packets}"
            assert error.reason_code == reply[2], repr(error)
        elif reply[0] == 0x20 and reply[3] != 0:  # CONNACK refusing the CONNECT
            assert error is not None, f"expected a CONNACK refusal, decoded {packets}"
            code = connack_v3_code(error.reason_code) if len(reply) == 4 else error.reason_code
            assert code == reply[3], repr(error)
        else:
            assert error is None, repr(error)
    if deviation is not None:
        assert deviated, f"listed as deviating with {deviation.our_rule}, but it did not raise it"
        return
    if not test.get("expect_disconnect", True):
        assert error is None, repr(error)
    else:
        assert error is not None or any(isinstance(p, Disconnect) for p in packets), (
            f"vector expects a disconnect; decoded {packets}")


def _check_session(session, packets, error, reply):
    """The codec accepts the packet; the session layer raises ``rule``."""
    rule, helper = session
    assert error is None, repr(error)
    assert rule is None or rule in RULES
    if helper is not None:
        err = helper(packets[-1])
        assert err.rule == rule
        if reply is not None and reply[0] == 0xE0:
            assert err.reason_code == reply[2]
        elif reply is not None and reply[0] == 0x20:
            assert connack_v3_code(err.reason_code) == reply[3]


def test_deviation_names_exist_in_the_vectors():
    if not VECTORS.is_dir():
        pytest.skip(f"conformance vectors not present at {VECTORS}")
    names = {(p.values[0], _group_level(p.values[1], p.values[2]), p.values[2]["name"])
             for p in CASES}
    for key in list(DEVIATIONS) + list(SESSION):
        assert key in names, key


def test_session_only_rules_are_session_rules():
    for rule in SESSION_ONLY_RULES:
        assert RULES[rule].enforced == "session"
