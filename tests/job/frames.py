"""Test helpers: write MQTT frames into a capture log as the edge would."""

from __future__ import annotations

from bridge.capture import CaptureLog
from bridge.mqtt import Properties, Publish, PubRel, encode


def headers(conn: str, proto: int = 5, origin: str = "client", **extra: str) -> list[tuple[str, bytes]]:
    h = [("conn_id", conn.encode()), ("proto", str(proto).encode()), ("origin", origin.encode()),
         ("remote", b"127.0.0.1:50000")]
    h += [(k, v.encode()) for k, v in extra.items()]
    return h


def append_publish(log: CaptureLog, conn: str, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False,
                   packet_id: int | None = None, proto: int = 5, props: Properties | None = None, **extra: str):
    pkt = Publish(qos=qos, retain=retain, topic=topic, packet_id=(packet_id or 1) if qos else None,
                  payload=payload, properties=props if (props is not None and proto == 5) else Properties())
    return log.append(conn, conn.encode(), encode(pkt, proto), headers(conn, proto, **extra))


def append_pubrel(log: CaptureLog, conn: str, packet_id: int, rel_topic: str, proto: int = 5):
    return log.append(conn, conn.encode(), encode(PubRel(packet_id=packet_id), proto),
                      headers(conn, proto, rel_topic=rel_topic))


def append_raw(log: CaptureLog, conn: str, frame: bytes, proto: int = 5):
    return log.append(conn, conn.encode(), frame, headers(conn, proto))


def run_once(spark, cfg, timeout: float = 240) -> None:
    """Run the streaming job over what the capture log holds, then return
    (``--once``); the shared session keeps no listener of the checkpoint."""
    from bridge.job.pipeline import release, start_query

    query = start_query(spark, cfg, once=True)
    try:
        assert query.awaitTermination(timeout), f"the job did not finish within {timeout:g} s"
    finally:
        release(spark)
