"""Rare packet types, decoded per row by the edge's own scalar codec.

CONNECT, CONNACK, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, DISCONNECT and
AUTH occur a few times per *connection* (PUBLISH and its acknowledgements a
few times per *message*), and CONNECT alone has a dozen conditional fields
(Will, user name, password, two property blocks). Vectorising them would
double the rule code for a negligible share of rows, so these rows -- and
only these -- go through :func:`bridge.mqtt.decode_packet` one by one: the
codec is the reference, so they agree with the edge by construction. The
parser's benchmark reports the share of time spent here.

Runs on executors; imports only the codec (pure Python).
"""

from __future__ import annotations

import numpy as np

from bridge.mqtt.codec import decode_packet
from bridge.mqtt.connect import Connect
from bridge.mqtt.errors import IncompleteData, MqttError

__all__ = ["SCALAR_TYPES", "ScalarRows", "decode_rows"]

#: Packet types decoded per row by the scalar codec.
SCALAR_TYPES = frozenset({1, 2, 8, 9, 10, 11, 14, 15})

#: Columns filled from the decoded packets.
COLUMNS = (
    "packet_id", "reason_code", "client_id", "connect_protocol_level", "clean_start",
    "keepalive", "will_topic", "will_payload", "will_qos", "will_retain", "will_properties",
)


class ScalarRows:
    """Outcome of :func:`decode_rows` for ``rows`` (batch row indices).

    ``incomplete`` and ``trailing`` are the rows whose record is shorter /
    longer than its frame (the caller reports them with its own checks);
    ``values[column]`` is a list aligned with ``rows`` (None where absent).
    """

    __slots__ = ("rows", "incomplete", "trailing", "values")

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows
        self.incomplete: list[int] = []
        self.trailing: list[int] = []
        self.values: dict[str, list] = {c: [None] * len(rows) for c in COLUMNS}


def _will_properties(props) -> dict:
    return {
        "will_delay_interval": props.will_delay_interval,
        "payload_format_indicator": props.payload_format_indicator,
        "message_expiry_interval": props.message_expiry_interval,
        "content_type": props.content_type,
        "response_topic": props.response_topic,
        "correlation_data": props.correlation_data,
        "user_properties": [{"key": k, "value": v} for k, v in props.user_properties],
    }


def decode_rows(problems, data: np.ndarray, start: np.ndarray, end: np.ndarray,
                rows: np.ndarray, levels: np.ndarray, from_client: np.ndarray,
                max_packet_bytes: int | None) -> ScalarRows:
    """Decode the frames ``data[start[r]:end[r]]`` of ``rows`` with the codec.

    ``levels`` holds -1 (or anything but 3, 4, 5) for "no CONNECT seen", which
    the codec calls ``None``. Rule violations go to ``problems`` with the
    codec's rule, text and reason code.
    """
    out = ScalarRows(rows)
    view = memoryview(data)
    vals = out.values
    # Per-row Python: these packet types are rare (see the module docstring).
    for i, row in enumerate(rows.tolist()):
        level = int(levels[row])
        level = level if level in (3, 4, 5) else None
        client = True if level is None else bool(from_client[row])
        buf = view[int(start[row]):int(end[row])]
        try:
            packet, used = decode_packet(buf, level, max_packet_bytes=max_packet_bytes,
                                         from_client=client)
        except IncompleteData:
            out.incomplete.append(row)
            continue
        except MqttError as err:
            problems.set_error(row, err.rule, str(err), err.reason_code)
            continue
        if used != len(buf):
            out.trailing.append(row)
            continue
        vals["packet_id"][i] = getattr(packet, "packet_id", None)
        vals["reason_code"][i] = getattr(packet, "reason_code", None)
        if isinstance(packet, Connect):
            vals["client_id"][i] = packet.client_id
            vals["connect_protocol_level"][i] = packet.protocol_level
            vals["clean_start"][i] = packet.clean_start
            vals["keepalive"][i] = packet.keepalive
            will = packet.will
            if will is not None:
                vals["will_topic"][i] = will.topic
                vals["will_payload"][i] = will.payload
                vals["will_qos"][i] = will.qos
                vals["will_retain"][i] = will.retain
                vals["will_properties"][i] = _will_properties(will.properties)
    return out
