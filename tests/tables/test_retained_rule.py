"""The retained rule as a pure function: MQTT-3.3.1-5/-6/-7/-8, latest-wins, duplicates, wills."""

import datetime as dt

from bridge.tables.retained_rule import RETAINED_SCHEMA, retained_changes
from tests.tables.rows import T0, publish, table


def by_topic(t):
    return {r["topic"]: r for r in t.to_pylist()}


def test_mqtt_3_3_1_5_retain_with_payload_replaces():
    out = by_topic(retained_changes(table([publish("a", b"v1", seq=1), publish("a", b"v2", seq=2)])))
    assert out["a"]["payload"] == b"v2" and out["a"]["deleted"] is False and out["a"]["seq"] == 2


def test_mqtt_3_3_1_6_and_7_zero_bytes_removes_and_is_not_stored():
    out = by_topic(retained_changes(table([publish("a", b"v1", seq=1), publish("a", b"", seq=2)])))
    row = out["a"]
    assert row["deleted"] is True
    assert row["payload"] is None and row["qos"] is None and row["set_at"] is None
    assert row["seq"] == 2  # the tombstone remembers the removal's capture order


def test_mqtt_3_3_1_8_retain_0_is_never_stored_and_changes_nothing():
    out = retained_changes(table([publish("a", b"v1", retain=False, seq=1), publish("b", b"", retain=False, seq=2)]))
    assert out.num_rows == 0


def test_retain_0_after_retain_1_does_not_replace():
    out = by_topic(retained_changes(table([publish("a", b"keep", seq=1), publish("a", b"live", retain=False, seq=2)])))
    assert out["a"]["payload"] == b"keep"


def test_latest_by_capture_sequence_wins_regardless_of_row_order():
    rows = [publish("a", b"new", seq=10, partition=1), publish("a", b"old", seq=3, partition=0)]
    assert by_topic(retained_changes(table(rows)))["a"]["payload"] == b"new"
    rows = [publish("a", b"", seq=10), publish("a", b"old", seq=3)]
    assert by_topic(retained_changes(table(rows)))["a"]["deleted"] is True


def test_edge_marked_qos2_duplicates_are_ignored():
    rows = [publish("a", b"v1", seq=1, qos=2), publish("a", b"v1", seq=2, qos=2, duplicate=True)]
    out = by_topic(retained_changes(table(rows)))
    assert out["a"]["seq"] == 1


def test_retained_will_counts_as_a_retained_publish():
    out = by_topic(retained_changes(table([publish("dev/status", b"offline", seq=5, origin="will")])))
    assert out["dev/status"]["origin"] == "will" and out["dev/status"]["payload"] == b"offline"


def test_expires_at_is_receive_time_plus_message_expiry_interval():
    at = T0
    out = by_topic(retained_changes(table([publish("a", b"v", seq=1, expiry=60, at=at), publish("b", b"v", seq=2)])))
    assert out["a"]["expires_at"] == at + dt.timedelta(seconds=60)
    assert out["a"]["set_at"] == at
    assert out["b"]["expires_at"] is None


def test_properties_and_coordinates_are_carried():
    rows = [publish("a", b"v", seq=7, partition=3, offset=99, user_properties=[("k", "1"), ("k", "2")], content_type="text/plain")]
    row = by_topic(retained_changes(table(rows)))["a"]
    assert (row["partition"], row["offset"], row["seq"]) == (3, 99, 7)
    assert row["user_properties"] == [{"key": "k", "value": "1"}, {"key": "k", "value": "2"}]
    assert row["content_type"] == "text/plain" and row["client_id"] == "dev-1"


def test_empty_input_gives_empty_table_with_schema():
    out = retained_changes(table([]))
    assert out.num_rows == 0 and out.schema == RETAINED_SCHEMA


def test_many_topics_one_row_each():
    rows = [publish(f"t/{i % 50}", bytes([i % 7]) * (i % 3), seq=i) for i in range(1000)]
    out = by_topic(retained_changes(table(rows)))
    assert len(out) == 50
    for i in range(950, 1000):  # the last publish per topic decides
        r = out[f"t/{i % 50}"]
        assert r["seq"] == i
        assert r["deleted"] is (i % 3 == 0)
