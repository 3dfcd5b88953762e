"""Every rule the MQTT codec enforces (or exposes for the session), as data.

``RULES`` maps a rule id to ``Rule(text, reason_code, kind, enforced, v311,
seed, note)``:

* **id** -- the normative statement id of the OASIS MQTT 5.0 standard. A rule
  that exists only in MQTT 3.1/3.1.1 uses its 3.1.1 id. A rule with no
  normative id in either standard uses a project id ``LG-...`` and says in
  ``note`` which prose of the standard (or which conformance-vector choice) it
  comes from.
* **reason_code** -- what the receiver sends: a DISCONNECT reason in MQTT 5
  (a CONNACK reason when the packet was the CONNECT). In 3.x the connection
  is closed (CONNECT errors may answer a 3.x CONNACK, see
  :func:`bridge.mqtt.reason_codes.connack_v3_code`).
* **kind** -- ``"malformed"`` (raised as :class:`MalformedPacket`) or
  ``"protocol"`` (:class:`ProtocolError`).
* **enforced** -- ``"decode"`` (the decoder raises it from the bytes alone),
  ``"session"`` (needs connection state: the session layer raises it, with
  this table's rule and reason) or ``"encode"`` (the encoder refuses to
  produce it; a decoder cannot observe it).
* **v311** -- the MQTT 3.1.1 id of the same statement when it differs.
* **seed** -- the id the seed documents (``../shared/seeds``) give the same
  statement when it differs from the standard's.

Classification policy (malformed 0x81 vs protocol error 0x82): where the
standard says which it is, the standard wins; where it is silent we follow the
Mosquitto conformance vectors; ``VECTOR_DEVIATIONS`` lists every vector whose
expected reason code we knowingly do not send, with the standard's text that
overrules it.

``render_markdown()`` produces ``docs/rules.md``; a test keeps the file in
step. Regenerate with ``python -m bridge.mqtt > docs/rules.md``.

One piece: this is a rule table, and the two tables beside it
(``SEED_NUMBERING``, ``VECTOR_DEVIATIONS``) are read with it:
:func:`render_markdown` renders all three into the one page
``docs/rules.md`` (each deviation with its rule's reason code from
``RULES``), and ``tests/mqtt/test_rules.py`` checks them against each other
(a rule's seed id is in ``SEED_NUMBERING``, a deviation names a rule of
``RULES`` with another reason code). Most of the lines are ``RULES``
itself, one entry per statement; split by length, a table would only be cut
in two.
"""

from __future__ import annotations

from typing import NamedTuple

from bridge.mqtt.errors import MalformedPacket, MqttError, ProtocolError

__all__ = [
    "AUTH_WITHOUT_METHOD",
    "CLIENT_ID_REJECTED",
    "DISCONNECT_SESSION_EXPIRY",
    "FIRST_PACKET_NOT_CONNECT",
    "PACKET_TOO_LARGE",
    "PAYLOAD_FORMAT_INVALID",
    "QOS_NOT_SUPPORTED",
    "RECEIVE_MAXIMUM_EXCEEDED",
    "RETAIN_NOT_SUPPORTED",
    "RULES",
    "Rule",
    "SECOND_CONNECT",
    "SEED_NUMBERING",
    "TOPIC_ALIAS_ABOVE_MAXIMUM",
    "TOPIC_ALIAS_UNMAPPED",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "VECTOR_DEVIATIONS",
    "render_markdown",
    "violation",
]

MALFORMED = "malformed"
PROTOCOL = "protocol"


class Rule(NamedTuple):
    """One enforced rule; see the module docstring for the columns."""

    text: str
    reason_code: int
    kind: str
    enforced: str = "decode"
    v311: str = ""
    seed: str = ""
    note: str = ""


_M, _P = MALFORMED, PROTOCOL

RULES: dict[str, Rule] = {
    # -- data representation ------------------------------------------------
    "MQTT-1.5.4-1": Rule(
        "A UTF-8 Encoded String is ill-formed UTF-8 or encodes a surrogate (U+D800..U+DFFF)",
        0x81, _M, v311="MQTT-1.5.3-1",
    ),
    "MQTT-1.5.4-2": Rule(
        "A UTF-8 Encoded String contains the null character U+0000", 0x81, _M, v311="MQTT-1.5.3-2",
    ),
    "MQTT-1.5.5-1": Rule(
        "A Variable Byte Integer does not use the minimum number of bytes", 0x81, _M,
        note="MQTT 5 only. MQTT 3.1.1 section 2.2.3 encodes the Remaining Length the same way "
        "with no minimum-bytes statement (3.1 neither): levels 3 and 4 accept a non-minimal one; "
        "a first CONNECT is judged by its own Protocol Version",
    ),
    "MQTT-1.5.7-1": Rule(
        "A string of a UTF-8 String Pair (User Property) is not a valid UTF-8 Encoded String",
        0x81, _M,
    ),
    "LG-utf8-disallowed": Rule(
        "A UTF-8 Encoded String contains a Disallowed Unicode code point "
        "(U+0001..U+001F, U+007F..U+009F or a non-character)",
        0x81, _M,
        note="MQTT 5.0 section 1.5.4 prose: the receiver MAY treat them as Malformed; "
        "the Mosquitto vectors require it",
    ),
    "LG-remaining-length": Rule(
        "The Remaining Length takes more than four bytes", 0x81, _M,
        note="MQTT 5.0 sections 1.5.5 and 2.1.4 (a Variable Byte Integer has at most four bytes); "
        "raised as soon as the fourth byte of the fixed header arrives",
    ),
    "LG-varint-length": Rule(
        "A Variable Byte Integer inside the packet takes more than four bytes", 0x81, _M,
        note="MQTT 5.0 section 1.5.5",
    ),
    "LG-truncated": Rule(
        "A field runs past the end of its packet or property block "
        "(the Remaining Length is too short for the content)",
        0x81, _M, note="MQTT 5.0 sections 1.5 and 2.1.4",
    ),
    "LG-trailing-bytes": Rule(
        "Bytes are left over after the last field of a packet (the Remaining Length is too long)",
        0x81, _M,
        note="MQTT 5.0 section 2.1.4; packets other than PUBLISH have no free-form payload",
    ),
    # -- fixed header, packet types, packet identifiers -----------------------
    "MQTT-2.1.3-1": Rule(
        "A reserved flag bit of the fixed header is not set to the value the standard lists",
        0x81, _M, v311="MQTT-2.2.2-1",
        note="not checked for MQTT 3.1 (level 3), which defines no reserved values",
    ),
    "LG-packet-type-reserved": Rule(
        "The packet type is reserved (0, or 15 before MQTT 5)", 0x82, _P,
        note="MQTT 5.0 table 2-1 'Reserved - Forbidden' names no reason code; "
        "the Mosquitto vectors answer 0x82",
    ),
    "LG-packet-direction": Rule(
        "The packet type may not flow in this direction (e.g. CONNACK, SUBACK, UNSUBACK or "
        "PINGRESP sent by a Client)",
        0x82, _P, note="MQTT 5.0 table 2-1 'Direction of flow'; the Mosquitto vectors answer 0x82",
    ),
    "MQTT-2.2.1-2": Rule(
        "A PUBLISH with QoS 0 must not contain a Packet Identifier", 0x81, _M, enforced="encode",
        v311="MQTT-2.3.1-5", seed="MQTT-3.3.2-4",
        note="structural: a QoS 0 PUBLISH has no Packet Identifier field, so only the encoder "
        "can check it",
    ),
    "MQTT-2.2.1-3": Rule(
        "A Client's SUBSCRIBE, UNSUBSCRIBE or QoS>0 PUBLISH has Packet Identifier 0", 0x82, _P,
        v311="MQTT-2.3.1-1", seed="MQTT-3.3.2-4",
        note="the standard names no reason code; the Mosquitto vectors answer 0x82",
    ),
    "MQTT-2.2.1-4": Rule(
        "A Server's QoS>0 PUBLISH has Packet Identifier 0", 0x82, _P, v311="MQTT-2.3.1-1",
    ),
    "MQTT-2.2.1-5": Rule(
        "A PUBACK, PUBREC, PUBREL or PUBCOMP has Packet Identifier 0 (no PUBLISH can have it)",
        0x82, _P, note="the Mosquitto vectors answer 0x82",
    ),
    "MQTT-2.2.1-6": Rule(
        "A SUBACK or UNSUBACK has Packet Identifier 0 (no SUBSCRIBE/UNSUBSCRIBE can have it)",
        0x82, _P,
    ),
    "MQTT-3.2.2-15": Rule(
        "A packet from the Client exceeds the Maximum Packet Size", 0x95, _P,
        note="checked from the fixed header, before the body is buffered; "
        "the same limit is applied to 3.x clients (closed without a reason code)",
    ),
    "MQTT-3.1.2-24": Rule(
        "A packet from the Server exceeds the Maximum Packet Size", 0x95, _P,
        note="the receiving-side mirror of MQTT-3.2.2-15 (decode with from_client=False); the "
        "edge raises it when its CONNACK would exceed the client's Maximum Packet Size and "
        "closes without any CONNACK (0x95 would blame the CONNECT)",
    ),
    # -- CONNECT / CONNACK ----------------------------------------------------
    "MQTT-3.1.0-1": Rule(
        "The first packet on a connection is not a CONNECT", 0x82, _P,
        note="decode_packet(..., protocol_level=None) accepts only CONNECT",
    ),
    "MQTT-3.1.0-2": Rule(
        "A second CONNECT on the same connection", 0x82, _P, enforced="session",
        note="also when the codec faults it (e.g. 0x84 for its Protocol Name or Version, a "
        "CONNACK code no DISCONNECT carries [MQTT-3.14.2-1]); the codec's error stays in the "
        "message",
    ),
    "MQTT-3.1.2-1": Rule(
        "The Protocol Name is not 'MQTT' (or 'MQIsdp' for MQTT 3.1)", 0x84, _P,
        note="close without CONNACK: the peer has not shown it speaks MQTT",
    ),
    "MQTT-3.1.2-2": Rule(
        "The Protocol Version is not supported (MQIsdp/3, MQTT/4 and MQTT/5 are)", 0x84, _P,
        note="answer a 3.x CONNACK with return code 0x01 (see reason_codes.connack_v3_code), "
        "as the Mosquitto vectors require for any unsupported level",
    ),
    "MQTT-3.1.2-3": Rule(
        "The reserved flag of the CONNECT Connect Flags is not 0", 0x81, _M,
        note="not checked for MQTT 3.1 (level 3)",
    ),
    "MQTT-3.1.2-9": Rule(
        "The Will Flag is set but the Will Properties, Will Topic or Will Payload is missing",
        0x81, _M,
    ),
    "MQTT-3.1.2-11": Rule(
        "The Will Flag is 0 but the Will QoS is not 0", 0x81, _M, v311="MQTT-3.1.2-13",
    ),
    "MQTT-3.1.2-12": Rule("The Will QoS is 3", 0x81, _M, v311="MQTT-3.1.2-14"),
    "MQTT-3.1.2-13": Rule(
        "The Will Flag is 0 but Will Retain is 1", 0x81, _M, v311="MQTT-3.1.2-15",
    ),
    "MQTT-3.1.2-16": Rule(
        "The User Name Flag is 0 but a User Name is present", 0x81, _M, v311="MQTT-3.1.2-18",
    ),
    "MQTT-3.1.2-17": Rule(
        "The User Name Flag is 1 but the User Name is missing", 0x81, _M, v311="MQTT-3.1.2-19",
    ),
    "MQTT-3.1.2-18": Rule(
        "The Password Flag is 0 but a Password is present", 0x81, _M, v311="MQTT-3.1.2-20",
    ),
    "MQTT-3.1.2-19": Rule(
        "The Password Flag is 1 but the Password is missing", 0x81, _M, v311="MQTT-3.1.2-21",
    ),
    "MQTT-3.1.2-22": Rule(
        "MQTT 3.1/3.1.1 only: the Password Flag is 1 but the User Name Flag is 0", 0x81, _M,
        v311="MQTT-3.1.2-22",
        note="this is the 3.1.1 statement; MQTT 5 allows a password without a user name and uses "
        "MQTT-3.1.2-22 for Keep Alive, which the codec does not enforce",
    ),
    "MQTT-3.1.3-3": Rule("The CONNECT payload lacks the Client Identifier", 0x81, _M,
                         v311="MQTT-3.1.3-3"),
    "MQTT-3.1.3-8": Rule(
        "The Server rejects the Client Identifier (3.1: not 1..23 characters; "
        "3.1.1: empty with Clean Session 0)",
        0x85, _P, enforced="session", v311="MQTT-3.1.3-8",
        note="connect.check_client_id() raises it; 3.x CONNACK return code 0x02",
    ),
    "LG-auth-data-without-method": Rule(
        "Authentication Data is present without an Authentication Method", 0x82, _P,
        note="MQTT 5.0 section 3.1.2.11.10 prose",
    ),
    "MQTT-3.2.2-1": Rule("Reserved bits 7-1 of the Connect Acknowledge Flags are not 0", 0x81, _M),
    "MQTT-3.2.2-6": Rule("CONNACK has Session Present 1 with a non-zero reason code", 0x82, _P),
    "MQTT-3.2.2-8": Rule(
        "The CONNACK reason code (3.x return code) is not one of the defined values", 0x82, _P,
    ),
    "MQTT-3.2.2-11": Rule(
        "PUBLISH QoS exceeds the Maximum QoS the Server announced", 0x9B, _P, enforced="session",
    ),
    "MQTT-3.2.2-14": Rule(
        "PUBLISH with RETAIN 1 although the Server announced Retain Available 0", 0x9A, _P,
        enforced="session",
    ),
    # -- PUBLISH --------------------------------------------------------------
    "MQTT-3.3.1-2": Rule(
        "PUBLISH has DUP 1 with QoS 0", 0x81, _M, v311="MQTT-3.3.1-2",
        note="the standard names no reason code; the Mosquitto vectors answer 0x81. "
        "Not checked for MQTT 3.1",
    ),
    "MQTT-3.3.1-4": Rule("PUBLISH has both QoS bits set (QoS 3)", 0x81, _M, v311="MQTT-3.3.1-4"),
    "MQTT-3.3.2-1": Rule(
        "The PUBLISH Topic Name is missing (the packet ends before it)", 0x81, _M,
        note="its UTF-8 requirement is reported as MQTT-1.5.4-1/-2",
    ),
    "MQTT-3.3.2-2": Rule(
        "The PUBLISH Topic Name contains a wildcard character ('+' or '#')", 0x81, _M,
        note="the standard names no reason code; the Mosquitto vectors answer 0x81",
    ),
    "LG-topic-name-empty": Rule(
        "The PUBLISH Topic Name is empty and there is no Topic Alias", 0x82, _P,
        note="MQTT 5.0 section 3.3.2.1 prose ('It is a Protocol Error if the Topic Name is zero "
        "length and there is no Topic Alias'); in 3.x it violates MQTT-4.7.3-1",
    ),
    "MQTT-3.3.2-8": Rule("PUBLISH has Topic Alias 0", 0x94, _P, seed="MQTT-3.3.2-5",
                         note="reason 0x94 per MQTT 5.0 section 3.3.4"),
    "MQTT-3.3.2-9": Rule(
        "PUBLISH has a Topic Alias greater than the Topic Alias Maximum the Server announced",
        0x94, _P, enforced="session", seed="MQTT-3.3.2-5",
    ),
    "MQTT-3.3.2-11": Rule(
        "PUBLISH from the Server has a Topic Alias greater than the Topic Alias Maximum the "
        "Client announced", 0x94, _P, enforced="session",
    ),
    "LG-topic-alias-unmapped": Rule(
        "PUBLISH has an empty Topic Name and a Topic Alias that has no mapping yet", 0x82, _P,
        enforced="session", note="MQTT 5.0 section 3.3.4 step 3a",
    ),
    "MQTT-3.3.2-14": Rule(
        "The Response Topic contains a wildcard character", 0x82, _P,
        note="the standard names no reason code; the Mosquitto vectors answer 0x82",
    ),
    "MQTT-3.3.4-6": Rule("A PUBLISH sent by a Client contains a Subscription Identifier", 0x82, _P),
    "MQTT-3.3.4-7": Rule(
        "The Client has more unacknowledged QoS>0 PUBLISH packets than Receive Maximum", 0x93, _P,
        enforced="session",
    ),
    "LG-payload-format-invalid": Rule(
        "Payload Format Indicator is 1 but the payload is not well-formed UTF-8", 0x99, _P,
        enforced="session",
        note="MQTT 5.0 section 3.3.2.3.2: the receiver MAY validate "
        "(publish.check_payload_format); the edge refuses with PUBACK/PUBREC 0x99 and keeps "
        "the connection, captures a QoS 0 one marked (it has no acknowledgement), and "
        "refuses a Will with CONNACK 0x99 (section 3.1.3.2.3); the job's parser applies the "
        "same check",
    ),
    # -- acknowledgements -----------------------------------------------------
    "MQTT-3.4.2-1": Rule("The PUBACK reason code is not a PUBACK Reason Code", 0x82, _P),
    "MQTT-3.5.2-1": Rule("The PUBREC reason code is not a PUBREC Reason Code", 0x82, _P),
    "MQTT-3.6.1-1": Rule(
        "PUBREL fixed-header flags are not 0,0,1,0", 0x81, _M, v311="MQTT-3.6.1-1",
    ),
    "MQTT-3.6.2-1": Rule("The PUBREL reason code is not a PUBREL Reason Code", 0x82, _P),
    "MQTT-3.7.2-1": Rule("The PUBCOMP reason code is not a PUBCOMP Reason Code", 0x82, _P),
    # -- SUBSCRIBE / UNSUBSCRIBE ---------------------------------------------
    "MQTT-3.8.1-1": Rule(
        "SUBSCRIBE fixed-header flags are not 0,0,1,0", 0x81, _M, v311="MQTT-3.8.1-1",
    ),
    "MQTT-3.8.3-2": Rule(
        "SUBSCRIBE contains no Topic Filter", 0x82, _P, v311="MQTT-3.8.3-3",
        note="MQTT 5.0 section 3.8.3: 'A SUBSCRIBE packet with no Payload is a Protocol Error'",
    ),
    "MQTT-3.8.3-4": Rule("No Local is set on a Shared Subscription", 0x82, _P),
    "MQTT-3.8.3-5": Rule(
        "Reserved bits of the Subscription Options are not 0 (bits 7-6; bits 7-2 in 3.1.1)",
        0x81, _M, v311="MQTT-3-8.3-4", note="not checked for MQTT 3.1",
    ),
    "LG-subscription-qos": Rule(
        "The Maximum QoS of a Subscription Option is 3", 0x82, _P,
        note="MQTT 5.0 section 3.8.3.1 prose (Protocol Error); 3.1.1 MQTT-3-8.3-4 makes it "
        "malformed, which changes nothing on the wire (3.x closes)",
    ),
    "LG-retain-handling": Rule(
        "The Retain Handling of a Subscription Option is 3", 0x82, _P,
        note="MQTT 5.0 section 3.8.3.1 prose",
    ),
    "MQTT-3.9.3-2": Rule(
        "A SUBACK reason code is not a Subscribe Reason Code (or the SUBACK has none)", 0x82, _P,
    ),
    "MQTT-3.10.1-1": Rule(
        "UNSUBSCRIBE fixed-header flags are not 0,0,1,0", 0x81, _M, v311="MQTT-3.10.1-1",
    ),
    "MQTT-3.10.3-2": Rule(
        "UNSUBSCRIBE contains no Topic Filter", 0x82, _P, v311="MQTT-3.10.3-2",
        note="MQTT 5.0 section 3.10.3: 'An UNSUBSCRIBE packet with no Payload is a Protocol Error'",
    ),
    "MQTT-3.11.3-2": Rule(
        "An UNSUBACK reason code is not an Unsubscribe Reason Code (or the UNSUBACK has none)",
        0x82, _P,
    ),
    "MQTT-4.7.0-1": Rule(
        "The Will Topic contains a wildcard character", 0x81, _M, v311="MQTT-4.7.1-1",
        note="classified like MQTT-3.3.2-2",
    ),
    "MQTT-4.7.1-1": Rule(
        "A '#' in a Topic Filter is not alone in the last level", 0x81, _M, v311="MQTT-4.7.1-2",
        note="the standard names no reason code; Mosquitto treats invalid filters as malformed",
    ),
    "MQTT-4.7.1-2": Rule(
        "A '+' in a Topic Filter does not occupy an entire level", 0x81, _M, v311="MQTT-4.7.1-3",
    ),
    "MQTT-4.7.3-1": Rule(
        "A Topic Filter or Will Topic is empty", 0x81, _M, v311="MQTT-4.7.3-1",
        note="the Mosquitto vectors answer 0x81 for an empty Topic Filter",
    ),
    "MQTT-4.8.2-1": Rule(
        "A Shared Subscription's ShareName is empty", 0x82, _P,
        note="MQTT 5 only; the Mosquitto vectors answer 0x82",
    ),
    "MQTT-4.8.2-2": Rule(
        "A Shared Subscription's ShareName contains '/', '+' or '#', or is not followed by "
        "'/' and a Topic Filter",
        0x82, _P, note="MQTT 5 only; the Mosquitto vectors answer 0x82",
    ),
    # -- DISCONNECT / AUTH ----------------------------------------------------
    "MQTT-3.14.1-1": Rule(
        "DISCONNECT fixed-header flags are not 0", 0x81, _M, v311="MQTT-3.14.1-1",
    ),
    "MQTT-3.14.2-1": Rule(
        "The DISCONNECT reason code is not a Disconnect Reason Code this sender may use", 0x82, _P,
    ),
    "MQTT-3.14.2-2": Rule("A Server's DISCONNECT contains a Session Expiry Interval", 0x82, _P),
    "LG-disconnect-session-expiry": Rule(
        "DISCONNECT sets a non-zero Session Expiry Interval after CONNECT set 0", 0x82, _P,
        enforced="session", note="MQTT 5.0 section 3.14.2.2.2 prose",
    ),
    "MQTT-3.15.1-1": Rule("AUTH fixed-header flags are not 0", 0x81, _M),
    "MQTT-3.15.2-1": Rule(
        "The AUTH reason code is not an Authenticate Reason Code this sender may use", 0x82, _P,
    ),
    "LG-auth-method-missing": Rule(
        "AUTH has no Authentication Method", 0x82, _P,
        note="MQTT 5.0 section 3.15.2.2.2 prose ('It is a Protocol Error to omit the "
        "Authentication Method'); this includes the short form with Remaining Length 0",
    ),
    "MQTT-4.12.0-7": Rule(
        "AUTH from a Client whose CONNECT had no Authentication Method", 0x82, _P,
        enforced="session",
    ),
    # -- properties -----------------------------------------------------------
    "LG-property-unknown": Rule(
        "A property identifier is not defined by MQTT 5", 0x81, _M,
        note="MQTT 5.0 section 2.2.2.2",
    ),
    "LG-property-not-allowed": Rule(
        "A property is not valid for this packet type", 0x81, _M,
        note="MQTT 5.0 section 2.2.2.2 ('an Identifier which is not valid for its packet type "
        "... is a Malformed Packet'); the Mosquitto vectors answer 0x82 in some packets, "
        "see the deviations below",
    ),
    "LG-property-duplicate": Rule(
        "A property that may appear once appears more than once", 0x82, _P,
        note="each property's section: 'It is a Protocol Error to include ... more than once'",
    ),
    "LG-property-value": Rule(
        "A property has a value the standard does not allow (a 0/1 byte that is neither, "
        "Receive Maximum 0, Maximum Packet Size 0, Subscription Identifier 0)",
        0x82, _P,
        note="each property's section; Payload Format Indicator other than 0/1 follows the "
        "Mosquitto vectors (0x82)",
    ),
}

# Rule ids the session layer (bridge/edge/session.py) needs by name.
FIRST_PACKET_NOT_CONNECT = "MQTT-3.1.0-1"
SECOND_CONNECT = "MQTT-3.1.0-2"
UNSUPPORTED_PROTOCOL_VERSION = "MQTT-3.1.2-2"
CLIENT_ID_REJECTED = "MQTT-3.1.3-8"
PACKET_TOO_LARGE = "MQTT-3.2.2-15"
QOS_NOT_SUPPORTED = "MQTT-3.2.2-11"
RETAIN_NOT_SUPPORTED = "MQTT-3.2.2-14"
TOPIC_ALIAS_ABOVE_MAXIMUM = "MQTT-3.3.2-9"
TOPIC_ALIAS_UNMAPPED = "LG-topic-alias-unmapped"
RECEIVE_MAXIMUM_EXCEEDED = "MQTT-3.3.4-7"
PAYLOAD_FORMAT_INVALID = "LG-payload-format-invalid"
DISCONNECT_SESSION_EXPIRY = "LG-disconnect-session-expiry"
AUTH_WITHOUT_METHOD = "MQTT-4.12.0-7"


def violation(
    rule: str,
    detail: str,
    *,
    packet_type: int | None = None,
    protocol_level: int | None = None,
    reason_code: int | None = None,
) -> MqttError:
    """Build (not raise) the error for ``rule``: the class and reason come from
    ``RULES``. An id missing from the table is a programming error (KeyError).
    """
    entry = RULES[rule]
    cls = MalformedPacket if entry.kind == MALFORMED else ProtocolError
    return cls(
        rule,
        detail,
        reason_code=entry.reason_code if reason_code is None else reason_code,
        packet_type=packet_type,
        protocol_level=protocol_level,
    )


# Where a seed document numbers a statement differently from the standard.
# seed id -> (standard id or "", what the statement says)
SEED_NUMBERING: dict[str, tuple[str, str]] = {
    "MQTT-3.3.1-8": (
        "",
        "Server sets RETAIN 1 on PUBLISH caused by a new subscription: a 3.1.1 statement; "
        "MQTT 5 states it without an id (section 3.3.1.3) and adds Retain Handling "
        "MQTT-3.3.1-9..-11",
    ),
    "MQTT-3.3.1-9": (
        "MQTT-3.3.1-12",
        "Server sets RETAIN 0 for established subscriptions: 3.1.1 numbering; MQTT 5 replaces it "
        "with Retain As Published (MQTT-3.3.1-12/-13)",
    ),
    "MQTT-3.3.1-10": (
        "MQTT-3.3.1-8",
        "RETAIN 0 from a Client: the Server must not store the message as retained",
    ),
    "MQTT-3.3.2-4": (
        "MQTT-2.2.1-2 / MQTT-2.2.1-3",
        "Packet Identifier presence: absent for QoS 0 (MQTT-2.2.1-2), non-zero for QoS>0 "
        "(MQTT-2.2.1-3). MQTT 5 MQTT-3.3.2-4 is about forwarding the Payload Format Indicator",
    ),
    "MQTT-3.3.2-5": (
        "MQTT-3.3.2-8 / MQTT-3.3.2-9",
        "Topic Alias 0 (MQTT-3.3.2-8) and above the announced maximum (MQTT-3.3.2-9). "
        "MQTT 5 MQTT-3.3.2-5 is about Message Expiry",
    ),
}


class Deviation(NamedTuple):
    """Conformance vectors (MQTT 5 groups of ``file``) whose expected reason
    code we knowingly differ from; ``vector_reason`` 0x00 means the vector
    expects the packet to be accepted."""

    file: str
    names: tuple[str, ...]
    vector_reason: int
    our_rule: str
    why: str


_PUBLISH_DISALLOWED = (
    "reason-string property", "request-problem-information (byte)", "maximum-qos (byte)",
    "retain-available (byte)", "wildcard-subscription-available (byte)",
    "subscription-identifier-available (byte)", "shared-subscription-available (byte)",
    "session-expiry-interval (four byte integer)", "will-delay-interval (four byte integer)",
    "maximum-packet-size (four byte integer)", "assigned-client-identifier (UTF-8 string)",
    "authentication-method (UTF-8 string)", "response-information (UTF-8 string)",
    "server-reference (UTF-8 string)", "authentication-data (binary data)",
    "server-keep-alive (two byte integer)", "receive-maximum (two byte integer)",
    "topic-alias-maximum (two byte integer)",
)
_ACK_DISALLOWED = (
    "with payload-format-indicator (byte)", "with request-problem-information (byte)",
    "with maximum-qos (byte)", "with retain-available (byte)",
    "with wildcard-subscription-available (byte)",
    "with subscription-identifier-available (byte)", "with shared-subscription-available (byte)",
    "with message-expiry-interval (four byte integer)",
    "with session-expiry-interval (four byte integer)",
    "with will-delay-interval (four byte integer)",
    "with maximum-packet-size (four byte integer)", "with content-type (UTF-8 string)",
    "with response-topic (UTF-8 string)", "with assigned-client-identifier (UTF-8 string)",
    "with authentication-method (UTF-8 string)", "with response-information (UTF-8 string)",
    "with server-reference (UTF-8 string)", "with correlation-data (binary data)",
    "with authentication-data (binary data)",
    "with subscription-identifier (variable byte integer)",
    "with server-keep-alive (two byte integer)", "with receive-maximum (two byte integer)",
    "with topic-alias-maximum (two byte integer)", "with topic-alias (two byte integer)",
)
_NOT_ALLOWED_WHY = (
    "MQTT 5.0 section 2.2.2.2: a property identifier not valid for the packet type is a "
    "Malformed Packet (0x81); Mosquitto answers 0x82 here but 0x81 for SUBSCRIBE/UNSUBSCRIBE"
)

VECTOR_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation("PUBLISH.json", _PUBLISH_DISALLOWED, 0x82, "LG-property-not-allowed",
              _NOT_ALLOWED_WHY),
    Deviation("PUBACK.json", tuple(f"40 {n}" for n in _ACK_DISALLOWED), 0x82,
              "LG-property-not-allowed", _NOT_ALLOWED_WHY),
    Deviation("PUBREC.json", tuple(f"50 {n}" for n in _ACK_DISALLOWED), 0x82,
              "LG-property-not-allowed", _NOT_ALLOWED_WHY),
    Deviation("PUBREL.json", tuple(f"62 {n}" for n in _ACK_DISALLOWED), 0x82,
              "LG-property-not-allowed", _NOT_ALLOWED_WHY),
    Deviation("PUBCOMP.json", tuple(f"70 {n}" for n in _ACK_DISALLOWED), 0x82,
              "LG-property-not-allowed", _NOT_ALLOWED_WHY),
    Deviation("DISCONNECT.json", tuple(f"E0 {n}" for n in _ACK_DISALLOWED
                                      if "session-expiry" not in n
                                      and "server-reference" not in n), 0x82,
              "LG-property-not-allowed", _NOT_ALLOWED_WHY),
    Deviation("PUBLISH.json", ("30 topic 0",), 0x81, "LG-topic-name-empty",
              "MQTT 5.0 section 3.3.2.1: 'It is a Protocol Error if the Topic Name is zero "
              "length and there is no Topic Alias' (0x82)"),
    Deviation("PUBLISH.json",
              ("subscription-identifier=1 (variable byte integer)",
               "subscription-identifier=0x7F (variable byte integer)",
               "subscription-identifier=0x8001 (variable byte integer)",
               "subscription-identifier=0xFF7F (variable byte integer)",
               "subscription-identifier=0x808001 (variable byte integer)",
               "subscription-identifier=0xFFFF7F (variable byte integer)",
               "subscription-identifier=0x80808001 (variable byte integer)",
               "subscription-identifier=0xFFFFFF7F (variable byte integer)"),
              0x00, "MQTT-3.3.4-6",
              "MQTT-3.3.4-6: a PUBLISH sent by a Client MUST NOT contain a Subscription "
              "Identifier (Protocol Error); Mosquitto accepts it"),
    Deviation("SUBSCRIBE.json",
              ("82 QoS 3 [MQTT-3-8.3-4]",), 0x81, "LG-subscription-qos",
              "MQTT 5.0 section 3.8.3.1: 'It is a Protocol Error if the Maximum QoS field has "
              "the value 3' (0x82)"),
    Deviation("SUBSCRIBE.json",
              ("82 QoS 0 retain handling=3 0x30 [MQTT-3-8.3-4]",), 0x81, "LG-retain-handling",
              "MQTT 5.0 section 3.8.3.1: 'It is a Protocol Error to send a Retain Handling "
              "value of 3' (0x82)"),
    Deviation("SUBSCRIBE.json",
              ("82 QoS 3 [MQTT-3-8.3-2] (no topic or qos)", "82 short 3"), 0x81, "MQTT-3.8.3-2",
              "MQTT 5.0 section 3.8.3: 'A SUBSCRIBE packet with no Payload is a Protocol "
              "Error' (0x82)"),
    Deviation("SUBSCRIBE.json",
              ("82 with subscription-identifier=0 (variable byte integer)",), 0x81,
              "LG-property-value",
              "MQTT 5.0 section 3.8.2.1.2: 'It is a Protocol Error if the Subscription "
              "Identifier has a value of 0' (0x82)"),
    Deviation("UNSUBSCRIBE.json", ("A2 short 3 [MQTT-3.10.3-2]",), 0x81, "MQTT-3.10.3-2",
              "MQTT 5.0 section 3.10.3: 'An UNSUBSCRIBE packet with no Payload is a Protocol "
              "Error' (0x82)"),
    Deviation("SUBACK.json", ("91", "92", "94", "98"), 0x81, "LG-packet-direction",
              "a SUBACK from a Client with bad flags has two faults; the standard does not "
              "order them and the codec reports the direction first for every packet type "
              "(Mosquitto does so for CONNACK and PINGRESP, not for SUBACK/UNSUBACK)"),
    Deviation("UNSUBACK.json", ("B1", "B2", "B4", "B8"), 0x81, "LG-packet-direction",
              "as for SUBACK: the direction is reported before the flags"),
    Deviation("AUTH.json", ("F1", "F2", "F4", "F8"), 0x82, "MQTT-3.15.1-1",
              "MQTT-3.15.1-1: invalid AUTH flags are malformed (0x81); Mosquitto first "
              "rejects AUTH without an Authentication Method in CONNECT (session state)"),
)


def _hex(code: int) -> str:
    return f"0x{code:02X}"


def render_markdown() -> str:
    """The text of ``docs/rules.md``, generated from ``RULES``,
    ``SEED_NUMBERING`` and ``VECTOR_DEVIATIONS``."""
    out = [
        "# MQTT rules enforced by `bridge/mqtt`",
        "",
        "<!-- Generated by `python -m bridge.mqtt > docs/rules.md`; do not edit by hand. "
        "tests/mqtt/test_rules.py fails when this file is stale. -->",
        "",
        "Ids are the OASIS MQTT 5.0 normative statement ids. A rule that exists only in "
        "MQTT 3.1/3.1.1 keeps its 3.1.1 id; a rule with no normative id in either standard "
        "has a project id `LG-...` whose note names the prose it comes from.",
        "",
        "* **kind**: `malformed` raises `MalformedPacket`, `protocol` raises `ProtocolError`.",
        "* **reason**: the DISCONNECT reason (CONNACK reason for a CONNECT) sent in MQTT 5; "
        "3.x closes the connection.",
        "* **enforced**: `decode` = the decoder raises it from the bytes alone; `session` = "
        "needs connection state, raised by the session layer with this rule and reason; "
        "`encode` = the encoder refuses to produce it.",
        "* Where the standard says malformed or protocol error, it wins; where it is silent, "
        "the Mosquitto conformance vectors decide (see the deviations at the end).",
        "",
        "| id | kind | reason | enforced | 3.1.1 id | seed id | rule | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rule_id in sorted(RULES, key=_sort_key):
        r = RULES[rule_id]
        v311 = r.v311 if r.v311 and r.v311 != rule_id else ""
        out.append(
            f"| {rule_id} | {r.kind} | {_hex(r.reason_code)} | {r.enforced} | {v311} | "
            f"{r.seed} | {r.text} | {r.note} |"
        )
    out += [
        "",
        "## Seed documents numbered differently",
        "",
        "The seed documents in `../shared/seeds/` number these statements differently from "
        "the MQTT 5.0 standard; the standard's id is the one used in code, errors and tests.",
        "",
        "| seed id | standard id | statement |",
        "|---|---|---|",
    ]
    for seed_id in sorted(SEED_NUMBERING, key=_sort_key):
        std, what = SEED_NUMBERING[seed_id]
        out.append(f"| {seed_id} | {std or '(none)'} | {what} |")
    out += [
        "",
        "The two PUBLISH byte examples of seed `000_*.txt` carry wrong Remaining Lengths "
        "(0x0E and 0x0B where both bodies are 12 bytes long) and are not used as valid frames.",
        "",
        "## Deviations from the Mosquitto conformance vectors",
        "",
        "Vectors in `../shared/conformance/mosquitto-vectors/` (MQTT 5 groups) whose "
        "expected DISCONNECT reason we knowingly do not send: the standard says otherwise, or "
        "it is silent and the vectors themselves are inconsistent (each row says why). "
        "A vector reason of 0x00 means the vector expects the packet to be accepted. "
        "tests/mqtt/test_vectors.py checks that each listed vector raises the rule named here.",
        "",
        "| file | vectors | vector reason | our rule | our reason | why |",
        "|---|---|---|---|---|---|",
    ]
    for d in VECTOR_DEVIATIONS:
        names = "; ".join(f"`{n}`" for n in d.names)
        out.append(
            f"| {d.file} | {names} | {_hex(d.vector_reason)} | {d.our_rule} | "
            f"{_hex(RULES[d.our_rule].reason_code)} | {d.why} |"
        )
    return "\n".join(out) + "\n"


def _sort_key(rule_id: str) -> tuple:
    if rule_id.startswith("LG-"):
        return (1, (), rule_id)
    section, _, counter = rule_id.removeprefix("MQTT-").rpartition("-")
    parts = tuple(int(p) if p.isdigit() else 0 for p in section.replace("-", ".").split("."))
    return (0, parts + (int(counter) if counter.isdigit() else 0,), rule_id)
