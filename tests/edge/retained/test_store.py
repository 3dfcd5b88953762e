"""The edge's retained store (bridge/edge/retained): the table's latest
version overlaid with the edge's own captures, served as a replay per
subscription. In process: a real delta-rs table in a temporary directory,
no sockets. Test names carry the rule ids."""

from __future__ import annotations

import datetime as dt
import time

import numpy as np
import pytest

from bridge.capture import CaptureLog, LogReader
from bridge.edge.delivery import Outbox, Receiver
from bridge.edge.message import Message
from bridge.edge.retained.store import RetainedStore
from bridge.mqtt import Properties, Publish, decode_packet, encode
from bridge.tables.coverage import coverage_metadata
from bridge.tables.deltars import DeltaRsEngine
from bridge.tables.retained_rule import retained_changes
from tests.tables.rows import publish as row, table

STREAM = "mqtt-frames"


def write(tmp_path, rows, batch=0, covered=None, stream=STREAM):
    eng = DeltaRsEngine(tmp_path / "tables")
    eng.ensure()
    for r in rows:
        r.setdefault("stream", stream)
    meta = coverage_metadata(stream, covered, "q", batch) if covered is not None else None
    eng.merge_retained(retained_changes(table(rows)), "q", batch, meta)
    return eng


def store_for(tmp_path, clock_offset=0.0) -> RetainedStore:
    s = RetainedStore(tmp_path / "tables" / "retained", STREAM, clock_offset, 1 << 20)
    s.swap(s.load())
    return s


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def drain(replay, n=1000) -> list:
    """Every delivery of a replay, in order."""
    out = []
    while not replay.done:
        out += replay.take(n)
    return out


def wall() -> float:
    return time.time()


def test_mqtt_3_3_1_8_table_rows_go_out_retained_with_min_qos_and_stored_properties(tmp_path):
    write(tmp_path, [
        row("a/1", b"one", seq=1, qos=2, at=now()),
        row("a/2", b"two", seq=2, qos=0, at=now(), content_type="text/plain",
            user_properties=[("k", "v"), ("k", "w")]),
        row("b/x", b"bx", seq=3, at=now())])
    s = store_for(tmp_path)
    got = drain(s.replay("a/#", 1, (7,), wall()))
    by_topic = {d.msg.topic: d for d in got}
    assert sorted(by_topic) == ["a/1", "a/2"]
    assert all(d.retain for d in got)  # RETAIN 1 [MQTT-3.3.1-8]
    assert by_topic["a/1"].qos == 1 and by_topic["a/2"].qos == 0  # min(stored, granted)
    frame = by_topic["a/2"].msg.frame(5, 0, None, retain=True, sub_ids=(7,), now=wall())
    p, _ = decode_packet(frame, 5, from_client=False)
    assert p.retain and p.payload == b"two" and p.properties.content_type == "text/plain"
    assert p.properties.user_properties == [("k", "v"), ("k", "w")]  # in order [MQTT-3.3.2-18]
    assert p.properties.subscription_identifiers == [7]  # [MQTT-3.3.4-3]


def test_mqtt_3_3_2_5_and_3_3_2_6_expiry_counts_from_the_stored_arrival(tmp_path):
    t = now()
    write(tmp_path, [row("e/old", b"x", seq=1, at=t - dt.timedelta(seconds=100), expiry=60),
                     row("e/new", b"y", seq=2, at=t - dt.timedelta(seconds=10), expiry=60)])
    s = store_for(tmp_path, clock_offset=0.0)
    (d,) = drain(s.replay("e/+", 1, (), wall()))  # the expired one is not sent [MQTT-3.3.2-5]
    assert d.msg.topic == "e/new"
    p, _ = decode_packet(d.msg.frame(5, 1, 1, retain=True, now=wall()), 5, from_client=False)
    assert 45 <= p.properties.message_expiry_interval <= 50  # decremented [MQTT-3.3.2-6]


def test_mqtt_3_3_1_6_a_tombstone_in_the_table_is_not_served(tmp_path):
    write(tmp_path, [row("t/a", b"x", seq=1, at=now()), row("t/a", b"", seq=2, at=now()),
                     row("t/b", b"y", seq=3, at=now())])
    s = store_for(tmp_path)
    assert [d.msg.topic for d in drain(s.replay("t/#", 1, (), wall()))] == ["t/b"]


def msg(topic, payload=b"m", qos=1, ref=(0, 0)) -> Message:
    return Message(topic, qos, True, payload, origin="c", received=time.time(), ref=ref)


def test_mqtt_3_3_1_5_the_overlay_replaces_the_tables_message_and_a_clear_hides_it(tmp_path):
    write(tmp_path, [row("o/a", b"table", seq=10, at=now()), row("o/b", b"table", seq=11, at=now())])
    s = store_for(tmp_path)
    s.capture("o/a", 20, (0, 5), msg("o/a", b"edge"))  # newer capture: replaces [MQTT-3.3.1-5]
    s.capture("o/b", 21, (0, 6), msg("o/b", b""))      # zero bytes: clears [MQTT-3.3.1-6]
    s.capture("o/c", 22, (0, 7), msg("o/c", b"new"))
    got = {d.msg.topic: d.msg.payload for d in drain(s.replay("o/+", 1, (), wall()))}
    assert got == {"o/a": b"edge", "o/c": b"new"}


def test_the_jobs_rule_decides_between_a_table_row_and_an_overlay_entry(tmp_path):
    """Another edge's stream may hold a later sequence for the same topic:
    the higher sequence wins, as in the job's MERGE (retained_rule.supersedes)."""
    write(tmp_path, [row("x/a", b"other edge", seq=500, at=now(), partition=0)], stream="edge-b")
    s = store_for(tmp_path)
    s.capture("x/a", 20, (0, 5), msg("x/a", b"mine, older"))
    assert [d.msg.payload for d in drain(s.replay("x/a", 1, (), wall()))] == [b"other edge"]


def test_a_version_covering_the_overlay_takes_its_place(tmp_path):
    write(tmp_path, [row("c/a", b"v1", seq=1, at=now())], batch=0, covered={0: 1})
    s = store_for(tmp_path)
    s.capture("c/a", 9, (0, 9), msg("c/a", b"v2", ref=(0, 9)))
    assert len(s.overlay) == 1
    write(tmp_path, [row("c/a", b"v2", seq=9, at=now(), offset=9)], batch=1, covered={0: 10})
    s.swap(s.load())
    assert len(s.overlay) == 0 and s.snapshot.covered == {0: 10}
    assert [d.msg.payload for d in drain(s.replay("c/#", 1, (), wall()))] == [b"v2"]


def test_no_table_yet_serves_the_overlay_alone(tmp_path):
    s = store_for(tmp_path)
    assert s.snapshot is None and s.error is None
    s.capture("n/a", 1, (0, 1), msg("n/a"))
    assert [d.msg.topic for d in drain(s.replay("#", 1, (), wall()))] == ["n/a"]
    assert s.replay("z/#", 1, (), wall()) is None


def test_an_unreadable_table_is_one_line_and_the_overlay_still_serves(tmp_path, caplog):
    write(tmp_path, [row("u/a", b"x", seq=1, at=now())])
    log_dir = tmp_path / "tables" / "retained" / "_delta_log"
    for f in log_dir.glob("*.json"):
        f.write_text("{not json")
    s = store_for(tmp_path)
    assert s.snapshot is None and s.error is not None and "\n" not in s.error
    assert "retained table" in s.error
    s.capture("u/b", 2, (0, 1), msg("u/b"))
    assert [d.msg.topic for d in drain(s.replay("u/#", 1, (), wall()))] == ["u/b"]


def test_mqtt_3_3_1_8_replay_of_the_log_rebuilds_the_overlay(tmp_path):
    """At start the edge applies its own captures after the version's
    coverage: RETAIN 1 sets, zero bytes clear, RETAIN 0 changes nothing
    [MQTT-3.3.1-8 in 5.0 numbering], rejected and duplicate records count not."""
    log = CaptureLog.open(tmp_path / "capture", partitions=1)
    frames = [
        (encode(Publish(topic="r/a", payload=b"1", retain=True), 4), []),
        (encode(Publish(topic="r/a", payload=b"2", retain=False), 4), []),  # RETAIN 0: no change
        (encode(Publish(topic="r/b", payload=b"b", retain=True), 4), []),
        (encode(Publish(topic="r/b", payload=b"", retain=True), 4), []),    # clears r/b
        (encode(Publish(topic="r/c", payload=b"c", retain=True), 4), [("reject", b"LG-acl-publish")]),
        (encode(Publish(topic="r/d", payload=b"d", qos=2, packet_id=3, retain=True), 4),
         [("dup", b"1")]),
    ]
    for f, extra in frames:
        log.append("conn", b"dev", f, [("proto", b"4")] + extra)
    log.flush()
    s = store_for(tmp_path)
    reader = LogReader(log.root)
    s.replay_log(reader, s.start_offsets(reader.earliest_offsets()), log.next_offsets())
    log.close()
    got = {d.msg.topic: d.msg.payload for d in drain(s.replay("r/#", 1, (), wall()))}
    assert got == {"r/a": b"1"}


def test_mqtt_3_3_4_9_a_replay_is_paced_by_the_window_and_live_messages_wait_behind_it(tmp_path):
    write(tmp_path, [row(f"p/{i}", b"x", seq=i, at=now()) for i in range(5)])
    s = store_for(tmp_path)
    box = Outbox()
    replay = s.replay("p/+", 1, (), wall())
    box.add_replay(replay)
    live = Message("p/live", 1, False, b"L", ready=True)
    box.push(live, 1, False)
    rx = Receiver(4, 2)
    sent = box.pump(rx, wall())
    assert len(sent) == 2  # the window [MQTT-3.3.4-9]
    pids = [decode_packet(f, 4, from_client=False)[0].packet_id for f in sent]
    out = []
    while box.inflight or box.queue:
        for pid in list(box.inflight):
            box.puback(pid)
        out += [decode_packet(f, 4, from_client=False)[0] for f in box.pump(rx, wall())]
    topics = [p.topic for p in out]
    assert topics[-1] == "p/live" and len(topics) == 4  # the live message after every retained one
    assert all(p.retain for p in out[:-1]) and not out[-1].retain
    # the replay took the identifiers 1..5; the live delivery, pushed after, the 6th
    assert pids == [1, 2] and out[-1].packet_id == 6
    assert box.replays == 0


def test_a_replay_is_never_dropped_by_the_queue_bound(tmp_path):
    write(tmp_path, [row(f"q/{i}", b"x", seq=i, at=now()) for i in range(3)])
    s = store_for(tmp_path)
    box = Outbox(max_messages=2)
    box.add_replay(s.replay("q/+", 1, (), wall()))
    for i in range(5):
        box.push(Message(f"q/l{i}", 1, False, b"L", ready=True), 1, False)
    assert box.dropped == 4  # the oldest live ones went, the replay stayed
    rx = Receiver(4, 100)
    got = [decode_packet(f, 4, from_client=False)[0].topic for f in box.pump(rx, wall())]
    assert got == ["q/0", "q/1", "q/2", "q/l4"]


def test_a_large_qos_0_replay_is_handed_out_in_bounded_shares(tmp_path):
    n = 1200
    write(tmp_path, [row(f"big/{i}", b"x", seq=i, at=now(), qos=0) for i in range(n)])
    s = store_for(tmp_path)
    box = Outbox()
    box.add_replay(s.replay("big/#", 0, (), wall()))
    rx = Receiver(4, 20)
    first = box.pump(rx, wall())
    assert 0 < len(first) <= 500 and box.more  # the pump asks to be called again
    total = len(first)
    while box.more:
        total += len(box.pump(rx, wall()))
    assert total == n and box.replays == 0


def test_index_and_snapshot_memory_is_reported(tmp_path):
    write(tmp_path, [row(f"m/{i}", b"x", seq=i, at=now()) for i in range(100)])
    s = store_for(tmp_path)
    assert s.snapshot.index.nbytes() > 0 and s.topics() == 100
    assert isinstance(s.snapshot.index.match("m/+"), np.ndarray)


@pytest.mark.parametrize("covered, expect", [(None, [0, 0]), ({0: 5}, [5, 0]), ({0: 1, 1: 9}, [2, 9])])
def test_the_log_replay_starts_at_the_versions_coverage(tmp_path, covered, expect):
    write(tmp_path, [row("s/a", b"x", seq=1, at=now())], covered=covered)
    s = store_for(tmp_path)
    assert s.start_offsets([0, 0] if covered != {0: 1, 1: 9} else [2, 0]) == expect


def test_a_table_that_needs_reader_features_the_edge_lacks_is_refused_in_one_line(tmp_path):
    eng = write(tmp_path, [row("f/a", b"x", seq=1, at=now())])
    log_dir = tmp_path / "tables" / "retained" / "_delta_log"
    n = len(list(log_dir.glob("*.json")))
    (log_dir / f"{n:020d}.json").write_text(
        '{"commitInfo":{"timestamp":1,"operation":"SET TBLPROPERTIES"}}\n'
        '{"protocol":{"minReaderVersion":3,"minWriterVersion":7,'
        '"readerFeatures":["deletionVectors"],"writerFeatures":["deletionVectors"]}}\n')
    s = store_for(tmp_path)
    assert s.snapshot is None and s.error is not None and "\n" not in s.error
    assert "deletionVectors" in s.error and "own captures only" in s.error
    assert eng is not None


def test_rows_whose_table_file_was_vacuumed_under_a_replay_are_counted_lost(tmp_path, caplog):
    write(tmp_path, [row(f"v/{i}", b"x", seq=i, at=now()) for i in range(3)])
    s = RetainedStore(tmp_path / "tables" / "retained", STREAM, 0.0, cache_bytes=0)
    s.swap(s.load())
    replay = s.replay("v/+", 1, (), wall())
    for f in (tmp_path / "tables" / "retained").glob("*.parquet"):
        f.unlink()
    assert drain(replay) == [] and replay.lost == 3 and replay.done
    assert "cannot be read" in caplog.text
