"""The Mosquitto conformance vectors against a running edge (in-process, on an
ephemeral loopback port). Every vector passes, or is listed with its reason:
in ``docs/conformance.md`` (edge decisions) or in the codec's
``VECTOR_DEVIATIONS`` (``docs/rules.md``). A listed vector that passes, or that
sends something other than what is listed, fails too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bridge.config import load_config
from bridge.edge.server import EdgeThread
from bridge.mqtt.rules import RULES, VECTOR_DEVIATIONS
from tests.edge.conformance import (
    FILES, VECTORS, HelperPublish, listed_differences, load_vectors, run_vectors,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "conformance.md"

pytestmark = pytest.mark.skipif(not VECTORS.is_dir(),
                                reason=f"conformance vectors not present at {VECTORS}")

ALL = load_vectors() if VECTORS.is_dir() else []
CODEC = {(d.file, name): d for d in VECTOR_DEVIATIONS for name in d.names}
#: Codec deviations the edge does not show: an AUTH with bad flags has two
#: faults, and the edge judges the session one first (no Authentication
#: Method in the CONNECT [MQTT-4.12.0-7], 0x82), as Mosquitto does.
SESSION_FIRST = {("AUTH.json", name) for name in ("F1", "F2", "F4", "F8")}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    data = tmp_path_factory.mktemp("conformance")
    cfg = load_config(None, [f"data_dir={data}", "edge.port=0", "edge.receive_maximum=20",
                             "edge.topic_alias_maximum=10", "edge.max_packet_bytes=268435460"],
                      env={})
    with EdgeThread(cfg) as edge:
        # one Outcome per vector, in the order of ALL (keys are not unique:
        # SUBSCRIBE.json repeats three v5 vectors under the same name)
        return asyncio.run(run_vectors("127.0.0.1", edge.port, ALL))


@pytest.fixture(scope="module")
def listed():
    return listed_differences(DOC)


@pytest.mark.parametrize("index", range(len(ALL)),
                         ids=[f"{v.file}:{v.group}:{v.name.strip()}" for v in ALL])
def test_vector(index, outcomes, listed):
    o = outcomes[index]
    vector = o.vector
    assert vector is ALL[index]
    codec = CODEC.get((vector.file, vector.name)) if vector.ver == 5 else None
    entry = listed.get(vector.key)
    if o.passed:
        assert entry is None, "passes but docs/conformance.md lists it: remove the row"
        assert codec is None or (vector.file, vector.name) in SESSION_FIRST, (
            f"passes but VECTOR_DEVIATIONS lists it ({codec.our_rule})")
        return
    assert (vector.file, vector.name) not in SESSION_FIRST, o.detail
    if entry is not None:
        sends, _reason = entry
        assert o.got is not None and o.got.hex() == sends, (
            f"docs/conformance.md says the edge sends {sends}; {o.detail}")
        return
    if codec is not None:
        reason = RULES[codec.our_rule].reason_code
        assert o.got == bytes((0xE0, 1, reason)), (
            f"VECTOR_DEVIATIONS says {codec.our_rule} (DISCONNECT 0x{reason:02X}); {o.detail}")
        return
    pytest.fail(f"not listed in docs/conformance.md: {o.detail}")


def test_every_vector_file_is_replayed():
    """All the directory's vector files (19: the other 3 of its 22 files are
    the README and two licences), FLOW's second client included."""
    assert sorted(FILES) == sorted(p.stem for p in VECTORS.glob("*.json"))
    assert len(FILES) == 19
    helpers = [m for v in ALL for kind, m in v.msgs if kind == "publish"]
    assert len(helpers) == 16 and all(isinstance(m, HelperPublish) for m in helpers)


def test_every_listed_vector_exists(listed):
    keys = {v.key for v in ALL}
    assert set(listed) <= keys, sorted(set(listed) - keys)
    assert len(listed) == 26


def test_the_document_states_the_counts(outcomes, listed):
    assert len(outcomes) == len(ALL)
    passed = sum(o.passed for o in outcomes)
    codec = sum(1 for o in outcomes if not o.passed and o.vector.key not in listed)
    text = DOC.read_text()
    assert f"**{len(ALL)} vectors**" in text
    assert f"**Result: {passed} pass; {len(ALL) - passed} differ" in text
    assert f"({len(listed)} in the\ntable below, {codec} in the codec's deviation table)" in text


@pytest.fixture(scope="module")
def cluster_outcomes(tmp_path_factory, request):
    """The vectors against two edges of a cluster on the Kafka of
    scripts/services, each connection on the other edge than the one
    before, each helper publisher on the other edge than its vector's
    client (so every delivery crosses edges)."""
    import uuid

    from tests.conftest import delete_kafka_topics
    from tests.edge.cluster.conftest import cluster_config

    kafka = request.getfixturevalue("kafka")
    topic = f"lg-conformance-{uuid.uuid4().hex[:10]}"
    data = tmp_path_factory.mktemp("conformance-cluster")
    extra = ("edge.receive_maximum=20", "edge.topic_alias_maximum=10", "edge.max_packet_bytes=268435460")
    # a topic whose record limit is above MQTT's largest packet: the edges advertise no smaller
    # Maximum Packet Size than the one edge does (the capture log on Kafka's own limit, not the cluster's)
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka})
    admin.create_topics([NewTopic(topic, 4, 1, config={"max.message.bytes": "300000000"})])[topic].result(30)
    try:
        with EdgeThread(cluster_config(kafka, topic, data / "e0", 0, 2, *extra)) as e0, \
                EdgeThread(cluster_config(kafka, topic, data / "e1", 1, 2, *extra)) as e1:
            return asyncio.run(run_vectors("127.0.0.1", e0.port, ALL, ports=[e0.port, e1.port]))
    finally:
        delete_kafka_topics(kafka, [topic])


@pytest.mark.broker
def test_the_vectors_answer_alike_when_connections_alternate_between_two_edges(outcomes, cluster_outcomes):
    """Issue 43: every vector gets the same answer from a cluster of two
    edges, its client and its helper publisher on different edges, as from
    one edge."""
    differ = [f"{o.vector.file}:{o.vector.group}:{o.vector.name.strip()}: one edge "
              f"{'passes' if o.passed else 'sends ' + (o.got.hex() if o.got else '-')}, the cluster: {c.detail}"
              for o, c in zip(outcomes, cluster_outcomes)
              if o.passed != c.passed or (not o.passed and o.got != c.got)]
    assert not differ, "\n".join(differ[:20])
