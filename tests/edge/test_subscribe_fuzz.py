"""SUBSCRIBE and UNSUBSCRIBE fuzzed at every protocol version (issue 38,
item 3): whatever the filters, the session answers (SUBACK / UNSUBACK) or
closes the connection with one of the project's own errors; no other
exception escapes. Sans-IO, seeded, bounded in count."""

from __future__ import annotations

import random

import pytest

from bridge.edge.session import Limits
from bridge.mqtt import MqttError, Properties, Subscribe, Subscription, Unsubscribe, encode
from bridge.mqtt.fixed_header import encode_fixed_header
from tests.edge.util import Harness, connect

_PIECES = ["$share/", "$share", "$SYS", "$", "/", "//", "+", "#", "g", "a", "b", "é", "\u0000",
           "x" * 40, "+/", "/#", "$share/g", "$share//", "$share/+/", "$share/g/"]


def _filter(rng: random.Random) -> str:
    if rng.random() < 0.6:  # mostly valid: levels, wildcards in their place, $share prefixes
        levels = [rng.choice(["a", "b", "+", "", "$SYS", "é"]) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.3:
            levels.append("#")
        head = rng.choice(["", "", "$share/g/", "$share/", "$share/g"])
        return head + "/".join(levels)
    return "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 6)))


def _opts(rng: random.Random, level: int) -> dict:
    if level != 5:
        return {}
    return {"no_local": rng.random() < 0.3, "retain_as_published": rng.random() < 0.3,
            "retain_handling": rng.randint(0, 2)}


def _raw_subscribe(rng: random.Random, level: int, pid: int) -> bytes:
    """A SUBSCRIBE the codec's encoder might refuse: built by hand (any
    filter bytes, any options byte)."""
    body = bytearray(pid.to_bytes(2, "big"))
    if level == 5:
        body += b"\x00"
    for _ in range(rng.randint(0, 4)):
        tf = _filter(rng).encode("utf-8", "surrogatepass")
        body += len(tf).to_bytes(2, "big") + tf + bytes((rng.randint(0, 255) if rng.random() < 0.1
                                                        else rng.randint(0, 2),))
    return encode_fixed_header(0x82, len(body)) + bytes(body)


@pytest.mark.parametrize("level", [3, 4, 5])
def test_mqtt_4_8_2_1_subscribe_and_unsubscribe_fuzz_answers_or_closes(level):
    rng = random.Random(3800 + level)
    answered = closed = 0
    for round_ in range(600):
        h = Harness(Limits(max_subscriptions_per_client=8), conn_id=f"f{round_}")
        h.feed(connect(level, client_id=f"fz{round_}"))
        assert h.take()[0] == 0x20
        for i in range(1, 6):
            pick = rng.random()
            try:
                if pick < 0.45:
                    subs = [Subscription(_filter(rng), rng.randint(0, 2), **_opts(rng, level))
                            for _ in range(rng.randint(1, 4))]
                    frame = encode(Subscribe(i, subs), level)
                elif pick < 0.75:
                    frame = encode(Unsubscribe(i, [_filter(rng) for _ in range(rng.randint(1, 3))]),
                                   level)
                else:
                    frame = _raw_subscribe(rng, level, i)
            except MqttError:
                continue  # the encoder refused it: nothing to send
            try:
                h.feed(frame)
            except MqttError as exc:  # pragma: no cover - the session must answer, not raise
                pytest.fail(f"round {round_}: {frame!r} raised {exc!r}")
            out = h.take()
            if h.closed is not None:
                closed += 1
                assert "[" in h.closed, h.closed  # every close names its rule id
                break
            assert out and out[0] in (0x90, 0xB0), (round_, frame, out)
            answered += 1
    print(f"level {level}: {answered} answered, {closed} closed")
    assert answered > 100 and closed > 100  # both outcomes were exercised


@pytest.mark.parametrize("level", [3, 4])
@pytest.mark.parametrize("tf", ["$share/g", "$share/", "$share//", "$share/g/"])
def test_mqtt_3_8_3_incomplete_share_filters_are_ordinary_filters_before_mqtt5(level, tf):
    h = Harness()
    h.feed(connect(level, client_id="old"))
    h.take()
    h.feed(encode(Subscribe(7, [Subscription(tf, 1)]), level))
    assert h.closed is None
    assert h.take() == b"\x90\x03\x00\x07\x01"  # granted as an ordinary filter
    assert [s.topic_filter for s in h.session.router.tree.subscriptions("old")] == [tf]


@pytest.mark.parametrize("tf,rule", [("$share/g", "MQTT-4.8.2-2"), ("$share/", "MQTT-4.8.2-1"),
                                     ("$share//a", "MQTT-4.8.2-1"), ("$share/g/", "MQTT-4.8.2-2")])
def test_mqtt_4_8_2_1_and_2_incomplete_share_filters_close_mqtt5(tf, rule):
    h = Harness()
    h.feed(connect(5, client_id="new"))
    h.take()
    body = b"\x00\x07\x00" + len(tf).to_bytes(2, "big") + tf.encode() + b"\x01"
    h.feed(encode_fixed_header(0x82, len(body)) + body)
    assert h.closed is not None and rule in h.closed
    assert h.take()[:2] == b"\xe0\x01"  # DISCONNECT with its reason code
