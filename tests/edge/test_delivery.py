"""The per-session outbound state machine (bridge/edge/delivery.py): order,
Packet Identifiers, in-flight window, queue bound, expiry, Maximum Packet
Size, acknowledgements and re-sends. Sans-IO: messages in, bytes out, times
passed in.

Test names carry the rule id they check (OASIS MQTT 5.0 numbering; project
ids LG-... from bridge/edge/rules.py)."""

from __future__ import annotations

import struct

import pytest

from bridge.edge.delivery import QUEUED, RELEASED, SENT, AckMismatch, Outbox, Receiver
from bridge.edge.message import Message
from bridge.mqtt import Publish
from bridge.mqtt.codec import decode_packet

RX5 = Receiver(5, 100)


def msg(n: int = 0, *, qos: int = 2, payload: bytes | None = None, ready: bool = True,
        expiry: int | None = None, received: float = 0.0, retain: bool = False) -> Message:
    props = b"" if expiry is None else b"\x02" + struct.pack(">I", expiry)
    return Message(f"t/{n}", qos, retain, payload if payload is not None else b"m%d" % n, props,
                   received=received, expiry=expiry, exp_at=1 if expiry is not None else -1,
                   ref=(0, n), ready=ready)


def box_with(*qos: int, **kw) -> Outbox:
    box = Outbox(**kw)
    for n, q in enumerate(qos):
        box.push(msg(n), q, False)
    return box


def pubs(frames: list[bytes], level: int = 5) -> list[Publish]:
    out = []
    for f in frames:
        p, used = decode_packet(f, level, from_client=False)
        assert used == len(f)
        out.append(p)
    return out


def topics(frames: list[bytes], level: int = 5) -> list[str]:
    return [p.topic for p in pubs(frames, level)]


# ------------------------------------------------------------------ order
def test_mqtt_4_6_0_6_deliveries_leave_in_the_order_pushed_across_qos_levels():
    box = box_with(1, 0, 2, 0, 1)
    out = pubs(box.pump(RX5, 0.0))
    assert [(p.topic, p.qos, p.packet_id) for p in out] == [
        ("t/0", 1, 1), ("t/1", 0, None), ("t/2", 2, 2), ("t/3", 0, None), ("t/4", 1, 3)]
    assert box.sent == 5 and not box.queue and list(box.inflight) == [1, 2, 3]


def test_a_message_not_yet_durable_holds_back_everything_behind_it():
    box = Outbox()
    first = msg(0, ready=False)
    box.push(first, 1, False)
    box.push(msg(1), 0, False)
    box.push(msg(2), 1, False)
    assert box.pump(RX5, 0.0) == [] and not box.ready()
    assert len(box.queue) == 3 and not box.inflight
    first.ready = True
    assert box.ready()
    assert topics(box.pump(RX5, 0.0)) == ["t/0", "t/1", "t/2"]


def test_a_message_not_yet_durable_in_the_middle_lets_the_ones_before_it_go():
    box = Outbox()
    box.push(msg(0), 0, False)
    late = msg(1, ready=False)
    box.push(late, 0, False)
    box.push(msg(2), 0, False)
    assert topics(box.pump(RX5, 0.0)) == ["t/0"]
    late.ready = True
    assert topics(box.pump(RX5, 0.0)) == ["t/1", "t/2"]


# ------------------------------------------------------------------ packet identifiers
def test_packet_identifiers_are_k_mod_65535_plus_1_and_qos_0_takes_none():
    box = Outbox()
    box.next_k = 65533
    for n, q in enumerate((1, 0, 2, 1)):
        box.push(msg(n), q, False)
    assert [d.pid for d in box.queue] == [65534, None, 65535, 1]
    assert box.next_k == 65536


def test_a_packet_identifier_that_comes_round_while_in_flight_stalls_sending():
    box = Outbox()
    box.push(msg(0), 1, False)
    assert [p.packet_id for p in pubs(box.pump(RX5, 0.0))] == [1]
    box.next_k = 65535  # 65,534 deliveries later the next one gets 1 again
    box.push(msg(1), 1, False)
    box.push(msg(2), 0, False)  # behind it, in order: waits too
    assert box.queue[0].pid == 1
    assert box.pump(RX5, 0.0) == []
    assert box.puback(1) is not None
    out = pubs(box.pump(RX5, 0.0))
    assert [(p.topic, p.packet_id) for p in out] == [("t/1", 1), ("t/2", None)]


# ------------------------------------------------------------------ in-flight window
def test_mqtt_3_3_4_9_no_more_than_receive_maximum_unacknowledged_publishes():
    box = box_with(1, 2, 1, 2, 1)
    rx = Receiver(5, 2)
    assert topics(box.pump(rx, 0.0)) == ["t/0", "t/1"]
    assert box.pump(rx, 0.0) == []
    box.puback(1)
    assert topics(box.pump(rx, 0.0)) == ["t/2"]
    assert box.pump(rx, 0.0) == []


def test_mqtt_3_3_4_9_qos_0_publishes_take_no_place_in_the_window():
    box = box_with(1, 0, 0)
    rx = Receiver(5, 1)
    assert topics(box.pump(rx, 0.0)) == ["t/0", "t/1", "t/2"]


def test_mqtt_3_3_4_9_a_qos_0_behind_a_full_window_waits_its_turn():
    box = box_with(1, 1, 0)
    rx = Receiver(5, 1)
    assert topics(box.pump(rx, 0.0)) == ["t/0"]
    box.puback(1)
    assert topics(box.pump(rx, 0.0)) == ["t/1", "t/2"]


def test_mqtt_3_3_4_9_pubrec_below_0x80_keeps_the_slot_until_pubcomp():
    box = box_with(2, 2)
    rx = Receiver(5, 1)
    box.pump(rx, 0.0)
    d = box.pubrec(1, 0x00)
    assert d.state == RELEASED and box.pump(rx, 0.0) == []
    assert box.pubcomp(1) is d
    assert topics(box.pump(rx, 0.0)) == ["t/1"]


@pytest.mark.parametrize("code", [0x80, 0x87, 0x97])
def test_mqtt_3_3_4_9_pubrec_0x80_or_more_ends_the_delivery_and_frees_the_slot(code):
    box = box_with(2, 2)
    rx = Receiver(5, 1)
    box.pump(rx, 0.0)
    assert box.pubrec(1, code).pid == 1
    assert 1 not in box.inflight
    assert topics(box.pump(rx, 0.0)) == ["t/1"]


def test_mqtt_3_3_4_9_pubrec_0x7f_is_not_a_failure():
    box = box_with(2)
    box.pump(RX5, 0.0)
    assert box.pubrec(1, 0x10).state == RELEASED and 1 in box.inflight


# ------------------------------------------------------------------ acknowledgements
def test_qos_1_flow_puback_ends_the_delivery():
    box = box_with(1)
    box.pump(RX5, 0.0)
    d = box.inflight[1]
    assert d.state == SENT
    assert box.puback(1) is d and not box.inflight and len(box) == 0


def test_qos_2_flow_pubrec_then_pubcomp():
    box = box_with(2)
    box.pump(RX5, 0.0)
    assert box.inflight[1].state == SENT
    assert box.pubrec(1, 0).state == RELEASED
    assert box.pubcomp(1).pid == 1 and not box.inflight


def test_acknowledgements_of_unknown_packet_identifiers_return_none():
    box = box_with(1, 2)
    assert box.puback(1) is None  # queued, not sent yet
    box.pump(RX5, 0.0)
    assert (box.puback(9), box.pubrec(9, 0), box.pubcomp(9)) == (None, None, None)
    assert list(box.inflight) == [1, 2]


@pytest.mark.parametrize("qos, acks", [
    (2, [("puback",)]),                       # PUBACK for a QoS 2 PUBLISH
    (1, [("pubrec", 0)]),                     # PUBREC for a QoS 1 PUBLISH
    (1, [("pubcomp",)]),                      # PUBCOMP for a QoS 1 PUBLISH
    (2, [("pubcomp",)]),                      # PUBCOMP before PUBREC
    (2, [("pubrec", 0), ("puback",)]),        # PUBACK after PUBREC
])
def test_lg_edge_ack_mismatch_an_acknowledgement_of_the_wrong_kind_raises(qos, acks):
    box = box_with(qos)
    box.pump(RX5, 0.0)
    *before, (name, *args) = acks
    for b_name, *b_args in before:
        getattr(box, b_name)(1, *b_args)
    with pytest.raises(AckMismatch, match="Packet Identifier 1"):
        getattr(box, name)(1, *args)
    assert 1 in box.inflight  # the delivery is left as it was


# ------------------------------------------------------------------ DUP and re-sends
@pytest.mark.parametrize("level", [3, 4, 5])
def test_mqtt_3_3_1_1_and_3_dup_is_0_on_the_first_send_and_1_only_on_a_re_send(level):
    box = box_with(0, 1, 2)
    rx = Receiver(level, 10)
    first = pubs(box.pump(rx, 0.0), level)
    assert [p.dup for p in first] == [False, False, False]
    again = pubs(box.resend(rx, 0.0), level)
    assert [(p.topic, p.qos, p.packet_id, p.dup) for p in again] == [
        ("t/1", 1, 1, True), ("t/2", 2, 2, True)]


def test_mqtt_4_4_0_1_re_send_in_original_order_with_pubrel_for_released_ones():
    box = box_with(1, 2, 2, 1)
    rx = Receiver(5, 3)
    box.pump(rx, 0.0)          # t/0..t/2 in flight, t/3 queued (window 3)
    box.pubrec(2, 0)           # t/1 released: PUBREL due, not the PUBLISH
    again = box.resend(rx, 0.0)
    assert again[1] == b"\x62\x02\x00\x02"
    assert [(p.topic, p.packet_id, p.dup) for p in pubs([again[0], again[2]])] == [
        ("t/0", 1, True), ("t/2", 3, True)]
    assert len(again) == 3     # the queued one is not a re-send
    assert [(p.topic, p.dup) for p in pubs(box.pump(Receiver(5, 4), 0.0))] == [("t/3", False)]


def test_mqtt_4_4_0_1_re_sends_keep_retain_identifiers_and_original_packet_ids():
    box = Outbox()
    box.next_k = 40
    box.push(msg(0, retain=True), 1, True, (3, 4))
    box.pump(RX5, 0.0)
    (p,) = pubs(box.resend(RX5, 0.0))
    assert (p.packet_id, p.retain, p.dup, p.properties.subscription_identifiers) == (
        41, True, True, [3, 4])


def test_mqtt_3_3_2_6_a_re_send_carries_the_expiry_left_at_its_time():
    box = Outbox()
    box.push(msg(0, expiry=100, received=0.0), 1, False)
    (p,) = pubs(box.pump(RX5, 10.0))
    assert p.properties.message_expiry_interval == 90
    (p,) = pubs(box.resend(RX5, 30.0))
    assert p.properties.message_expiry_interval == 70


# ------------------------------------------------------------------ queue bound
def test_the_queue_bound_drops_the_oldest_queued_and_counts_them():
    box = Outbox(max_messages=3)
    returned = [box.push(msg(n), 1, False) for n in range(5)]
    assert returned == [0, 0, 0, 1, 1]
    assert box.dropped == 2
    assert topics(box.pump(RX5, 0.0)) == ["t/2", "t/3", "t/4"]
    # numbering is by push: the dropped ones used 1 and 2
    assert list(box.inflight) == [3, 4, 5]


def test_the_byte_bound_drops_the_oldest_queued_and_counts_them():
    box = Outbox(max_bytes=25)
    for n in range(3):
        box.push(msg(n, payload=b"x" * 10), 0, False)
    assert box.dropped == 1 and box.queued_bytes == 20
    assert box.push(msg(3, payload=b"y" * 30), 0, False) == 3  # larger than the bound alone
    assert box.queued_bytes == 0 and not box.queue and box.dropped == 4


def test_the_queue_bound_counts_only_what_is_queued_not_what_is_in_flight():
    box = Outbox(max_messages=2)
    box.push(msg(0), 1, False)
    box.push(msg(1), 1, False)
    box.pump(RX5, 0.0)
    box.push(msg(2), 1, False)
    box.push(msg(3), 1, False)
    assert box.dropped == 0 and len(box) == 4
    assert box.queued_bytes == 4


# ------------------------------------------------------------------ expiry
def test_mqtt_3_3_2_5_a_message_whose_interval_passed_before_sending_is_not_sent():
    box = Outbox()
    box.push(msg(0, expiry=10, received=0.0), 1, False)
    box.push(msg(1, expiry=11, received=0.0), 1, False)
    box.push(msg(2), 1, False)
    out = pubs(box.pump(RX5, 10.5))
    assert [(p.topic, p.properties.message_expiry_interval) for p in out] == [
        ("t/1", 1), ("t/2", None)]
    assert box.expired == 1
    assert list(box.inflight) == [2, 3]  # the expired one never took a slot


def test_mqtt_3_3_2_6_expiry_is_decremented_when_sent():
    box = Outbox()
    box.push(msg(0, expiry=100, received=50.0), 0, False)
    (p,) = pubs(box.pump(RX5, 75.2))
    assert p.properties.message_expiry_interval == 75


# ------------------------------------------------------------------ maximum packet size
def test_mqtt_3_1_2_25_a_publish_larger_than_the_clients_maximum_is_not_sent():
    box = Outbox()
    big = msg(0, payload=b"x" * 100)
    box.push(big, 1, False)
    box.push(msg(1, payload=b"y"), 1, False)
    size = big.frame_size(5, 1)
    out = pubs(box.pump(Receiver(5, 10, size - 1), 0.0))
    assert [p.topic for p in out] == ["t/1"]
    assert box.too_large == 1
    assert list(box.inflight) == [2]  # as if its delivery completed: no slot, no re-send
    assert len(box.resend(RX5, 0.0)) == 1


def test_mqtt_3_1_2_25_a_publish_of_exactly_the_maximum_is_sent():
    box = Outbox()
    m = msg(0, payload=b"x" * 100)
    box.push(m, 1, False)
    assert len(box.pump(Receiver(5, 10, m.frame_size(5, 1)), 0.0)) == 1
    assert box.too_large == 0


def test_mqtt_3_1_2_25_subscription_identifiers_count_towards_the_size():
    box = Outbox()
    m = msg(0, payload=b"x" * 20)
    box.push(m, 0, False, (268435455,))
    assert box.pump(Receiver(5, 10, m.frame_size(5, 0)), 0.0) == []
    assert box.too_large == 1


# ------------------------------------------------------------------ bookkeeping
def test_clear_forgets_queue_and_flight_but_keeps_the_numbering():
    box = box_with(1, 1, 1)
    box.pump(Receiver(5, 1), 0.0)
    box.clear()
    assert len(box) == 0 and box.queued_bytes == 0 and box.resend(RX5, 0.0) == []
    box.push(msg(9), 1, False)
    assert box.queue[0].pid == 4 and box.queue[0].state == QUEUED


def test_the_repr_shows_counts_not_payloads():
    box = Outbox()
    box.push(msg(0, payload=b"secret"), 0, False)
    assert "secret" not in repr(box) and "queued=1" in repr(box)
    assert "secret" not in repr(box.queue[0])


def test_mqtt_3_1_2_25_a_re_send_larger_than_the_new_connections_maximum_is_not_sent():
    # the client reconnects with a smaller Maximum Packet Size than before
    box = Outbox()
    big = msg(0, payload=b"x" * 100)
    box.push(big, 1, False)
    box.push(msg(1, payload=b"y"), 2, False)
    box.push(msg(2, payload=b"z" * 100), 2, False)
    box.pump(RX5, 0.0)
    box.pubrec(3, 0)  # released: its PUBREL has no size problem
    again = box.resend(Receiver(5, 10, big.frame_size(5, 1) - 1), 0.0)
    assert [p.packet_id for p in pubs(again[:1])] == [2] and again[1] == b"\x62\x02\x00\x03"
    assert len(again) == 2
    assert box.too_large == 1 and list(box.inflight) == [2, 3]  # as if completed


def test_mqtt_3_3_4_9_re_sends_respect_the_receive_maximum_of_the_new_connection():
    box = box_with(1, 1, 1)
    box.pump(Receiver(5, 3), 0.0)
    rx = Receiver(5, 1)  # the client reconnects with Receive Maximum 1
    assert [p.packet_id for p in pubs(box.resend(rx, 0.0))] == [1]
    box.puback(1)
    assert [(p.packet_id, p.dup) for p in pubs(box.pump(rx, 0.0))] == [(2, True)]
