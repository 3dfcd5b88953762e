"""A named catalogue of valid packets: every packet type, all three protocol
levels, every MQTT 5 property. Each entry is (name, level, from_client, packet);
``from_client`` is the direction the packet flows in (CONNACK, SUBACK,
UNSUBACK, PINGRESP come from the server).
"""

from __future__ import annotations

from typing import NamedTuple

from bridge.mqtt import (
    Auth, Connack, Connect, Disconnect, PingReq, PingResp, Properties, PubAck, PubComp, PubRec,
    PubRel, Publish, Suback, Subscribe, Subscription, Unsuback, Unsubscribe, Will,
)


class Entry(NamedTuple):
    name: str
    level: int
    from_client: bool
    packet: object


UP = [("region", "eu"), ("region", "eu"), ("k", "ä€𝄞")]  # duplicates and non-ASCII kept

# Every property at least once, in a packet (or Will) where it is allowed.
CONNECT_PROPS = Properties(
    session_expiry_interval=3600, receive_maximum=20, maximum_packet_size=1 << 20,
    topic_alias_maximum=10, request_response_information=1, request_problem_information=0,
    user_properties=UP, authentication_method="SCRAM-SHA-1", authentication_data=b"\x00\x01secret",
)
WILL_PROPS = Properties(
    will_delay_interval=30, payload_format_indicator=1, message_expiry_interval=60,
    content_type="text/plain", response_topic="reply/to", correlation_data=b"\xff\x00",
    user_properties=[("w", "1")],
)
CONNACK_PROPS = Properties(
    session_expiry_interval=0, receive_maximum=100, maximum_qos=1, retain_available=0,
    maximum_packet_size=65536, assigned_client_identifier="auto-1234", topic_alias_maximum=5,
    reason_string="welcome", user_properties=UP, wildcard_subscription_available=1,
    subscription_identifier_available=1, shared_subscription_available=0, server_keep_alive=30,
    response_information="resp/", server_reference="other:1883",
    authentication_method="SCRAM-SHA-1", authentication_data=b"server-final",
)
PUBLISH_PROPS = Properties(
    payload_format_indicator=0, message_expiry_interval=0xFFFFFFFF, topic_alias=65535,
    response_topic="a/b", correlation_data=b"", user_properties=UP, content_type="",
)
ACK_PROPS = Properties(reason_string="because", user_properties=[("a", "")])

CATALOGUE: list[Entry] = [
    # -- CONNECT ------------------------------------------------------------
    Entry("connect-v31-minimal", 3, True, Connect.for_level(3, client_id="c", keepalive=10)),
    Entry("connect-v31-full", 3, True, Connect.for_level(
        3, clean_start=False, keepalive=0, client_id="client-31",
        will=Will("will/t", b"bye", 2, True), username="u", password=b"p\x00w")),
    Entry("connect-v311-minimal", 4, True, Connect.for_level(4, client_id="")),
    Entry("connect-v311-full", 4, True, Connect.for_level(
        4, clean_start=False, keepalive=65535, client_id="x" * 300,
        will=Will("w/€", b"\x00" * 65535, 1, False), username="", password=b"")),
    Entry("connect-v311-username-only", 4, True, Connect.for_level(4, client_id="c", username="u")),
    Entry("connect-v5-minimal", 5, True, Connect.for_level(5, client_id="c")),
    Entry("connect-v5-full", 5, True, Connect.for_level(
        5, clean_start=True, keepalive=30, client_id="c5", properties=CONNECT_PROPS,
        will=Will("will/5", b"gone", 1, True, WILL_PROPS), username="user", password=b"pw")),
    Entry("connect-v5-password-without-username", 5, True,
          Connect.for_level(5, client_id="c", password=b"token")),
    # -- CONNACK ------------------------------------------------------------
    Entry("connack-v31", 3, False, Connack(False, 0)),
    Entry("connack-v311-session-present", 4, False, Connack(True, 0)),
    Entry("connack-v311-refused", 4, False, Connack(False, 5)),
    Entry("connack-v5-minimal", 5, False, Connack(False, 0)),
    Entry("connack-v5-full", 5, False, Connack(True, 0, CONNACK_PROPS)),
    Entry("connack-v5-refused", 5, False, Connack(False, 0x87, Properties(reason_string="no"))),
    # -- PUBLISH ------------------------------------------------------------
    Entry("publish-v31-qos0", 3, True, Publish(topic="a/b", payload=b"x")),
    Entry("publish-v31-qos2-dup-retain", 3, True,
          Publish(dup=True, qos=2, retain=True, topic="t", packet_id=65535, payload=b"")),
    Entry("publish-v311-qos0-empty", 4, True, Publish(topic="t")),
    Entry("publish-v311-qos1", 4, True, Publish(qos=1, topic="a/b/c", packet_id=1, payload=b"\x00")),
    Entry("publish-v311-large", 4, True,
          Publish(qos=1, retain=True, topic="big", packet_id=9, payload=bytes(range(256)) * 700)),
    Entry("publish-v311-from-server", 4, False,
          Publish(dup=True, qos=1, topic="s/t", packet_id=2, payload=b"hi")),
    Entry("publish-v5-qos0", 5, True, Publish(topic="sensor/1", payload=b"21.5")),
    Entry("publish-v5-all-props", 5, True,
          Publish(qos=2, topic="a/b", packet_id=300, properties=PUBLISH_PROPS, payload=b"p")),
    Entry("publish-v5-alias-only", 5, True,
          Publish(qos=1, topic="", packet_id=10, properties=Properties(topic_alias=1),
                  payload=b"data")),
    Entry("publish-v5-utf8-topic", 5, True, Publish(topic="\ufeffä/€/𝄞", payload=b"")),
    Entry("publish-v5-from-server-subids", 5, False,
          Publish(qos=1, topic="x", packet_id=5, payload=b"y",
                  properties=Properties(subscription_identifiers=[1, 268_435_455, 1]))),
    # -- acks ---------------------------------------------------------------
    Entry("puback-v31", 3, True, PubAck(1)),
    Entry("puback-v311", 4, False, PubAck(65535)),
    Entry("puback-v5-short", 5, True, PubAck(7)),
    Entry("puback-v5-reason", 5, True, PubAck(7, 0x10)),
    Entry("puback-v5-props", 5, False, PubAck(7, 0x99, ACK_PROPS)),
    Entry("puback-v5-success-props", 5, True, PubAck(7, 0, ACK_PROPS)),
    Entry("pubrec-v311", 4, True, PubRec(2)),
    Entry("pubrec-v5", 5, True, PubRec(2, 0x91, ACK_PROPS)),
    Entry("pubrel-v31", 3, True, PubRel(3)),
    Entry("pubrel-v311", 4, False, PubRel(3)),
    Entry("pubrel-v5", 5, True, PubRel(3, 0x92)),
    Entry("pubrel-v5-props", 5, True, PubRel(3, 0, ACK_PROPS)),
    Entry("pubcomp-v311", 4, True, PubComp(4)),
    Entry("pubcomp-v5", 5, False, PubComp(4, 0x92, ACK_PROPS)),
    # -- SUBSCRIBE / SUBACK -------------------------------------------------
    Entry("subscribe-v31", 3, True, Subscribe(1, [Subscription("a/+", 1), Subscription("#", 2)])),
    Entry("subscribe-v311", 4, True, Subscribe(10, [Subscription("a/b/#", 0),
                                                    Subscription("+/+/c", 2)])),
    Entry("subscribe-v5-options", 5, True, Subscribe(
        11, [Subscription("a", 2, no_local=True, retain_as_published=True, retain_handling=2),
             Subscription("$share/group/x/#", 1, retain_handling=1),
             Subscription("+", 0)],
        Properties(subscription_identifiers=[268_435_455], user_properties=UP))),
    Entry("suback-v31", 3, False, Suback(1, [0, 1, 2])),
    Entry("suback-v311", 4, False, Suback(10, [0, 2, 0x80])),
    Entry("suback-v5", 5, False, Suback(11, [2, 0x9E, 0xA2, 0x8F], ACK_PROPS)),
    # -- UNSUBSCRIBE / UNSUBACK ---------------------------------------------
    Entry("unsubscribe-v31", 3, True, Unsubscribe(2, ["a/+"])),
    Entry("unsubscribe-v311", 4, True, Unsubscribe(2, ["a/+", "#", "$share/g/t"])),
    Entry("unsubscribe-v5", 5, True, Unsubscribe(3, ["a", "$share/g/+"],
                                                 Properties(user_properties=[("x", "y")]))),
    Entry("unsuback-v31", 3, False, Unsuback(2)),
    Entry("unsuback-v311", 4, False, Unsuback(2)),
    Entry("unsuback-v5", 5, False, Unsuback(3, [0x00, 0x11, 0x87], ACK_PROPS)),
    # -- PINGREQ / PINGRESP -------------------------------------------------
    Entry("pingreq-v31", 3, True, PingReq()),
    Entry("pingreq-v5", 5, True, PingReq()),
    Entry("pingresp-v311", 4, False, PingResp()),
    Entry("pingresp-v5", 5, False, PingResp()),
    # -- DISCONNECT / AUTH --------------------------------------------------
    Entry("disconnect-v31", 3, True, Disconnect()),
    Entry("disconnect-v311", 4, True, Disconnect()),
    Entry("disconnect-v5-short", 5, True, Disconnect()),
    Entry("disconnect-v5-will", 5, True, Disconnect(0x04)),
    Entry("disconnect-v5-props", 5, True, Disconnect(
        0x00, Properties(session_expiry_interval=0, reason_string="bye", user_properties=UP))),
    Entry("disconnect-v5-from-server", 5, False,
          Disconnect(0x9C, Properties(server_reference="other", reason_string="moved"))),
    Entry("auth-v5-continue", 5, True, Auth(0x18, Properties(
        authentication_method="SCRAM-SHA-1", authentication_data=b"client-first",
        reason_string="r", user_properties=[("a", "b")]))),
    Entry("auth-v5-reauth", 5, True, Auth(0x19, Properties(authentication_method="M"))),
    Entry("auth-v5-success-from-server", 5, False, Auth(0x00, Properties(
        authentication_method="M"))),
]

BY_NAME = {e.name: e for e in CATALOGUE}
assert len(BY_NAME) == len(CATALOGUE), "catalogue names must be unique"
