"""What of a Delta table's protocol the edge's retained loader reads
(``bridge.edge.retained.snapshot.EDGE_READS``): the rule over (reader
version, reader features, column mapping mode), and a table whose log says
column mapping the old way (reader version 2, no feature list: what
delta-spark 4.4 writes for ``delta.columnMapping.mode = name``) refused in
one line. No Spark: the tables are delta-rs tables with a commit written
by hand; tests/edge/retained/test_retained_delta_spark.py writes the same
with delta-spark."""

from __future__ import annotations

import json
import logging

import pytest

from bridge.edge.retained.snapshot import EDGE_READS, unreadable
from bridge.edge.retained.store import RetainedStore
from bridge.tables.deltars import DeltaRsEngine
from bridge.tables.retained_rule import retained_changes
from tests.tables.rows import publish, table

STREAM = "mqtt-frames"
CM_NAME = {"delta.columnMapping.mode": "name"}


@pytest.mark.parametrize("version, features, conf, refused", [
    (1, None, {}, []),
    (1, None, {"delta.enableDeletionVectors": "false"}, []),
    # the legacy reader version 2 means column mapping: read only where no mode is set
    (2, None, {}, []),
    (2, None, {"delta.columnMapping.mode": "none"}, []),
    (2, None, CM_NAME, ["columnMapping"]),
    (2, None, {"delta.columnMapping.mode": "id"}, ["columnMapping"]),
    (3, [], {}, []),
    (3, ["timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"], {}, []),
    (3, ["deletionVectors"], {"delta.enableDeletionVectors": "true"}, ["deletionVectors"]),
    # the feature stays in the protocol after the property is turned off: files may still have vectors
    (3, ["deletionVectors"], {"delta.enableDeletionVectors": "false"}, ["deletionVectors"]),
    (3, ["columnMapping"], CM_NAME, ["columnMapping"]),
    (3, ["columnMapping"], {}, []),  # supported, never used: files carry the table's names
    (3, ["deletionVectors", "columnMapping", "timestampNtz"], CM_NAME, ["columnMapping", "deletionVectors"]),
    (3, ["typeWidening"], {}, ["typeWidening"]),
    (3, ["variantType"], {}, ["variantType"]),
    (3, ["someFeatureFrom2030"], {}, ["someFeatureFrom2030"]),
    (1, None, CM_NAME, ["columnMapping"]),  # a mode without the protocol: its files are still physical
    (4, None, {}, ["reader version 4"]),
])
def test_the_edge_reads_only_what_it_lists(version, features, conf, refused):
    assert unreadable(version, features, conf) == refused


def test_the_list_names_no_feature_that_changes_what_a_file_holds():
    assert not EDGE_READS["reader_features"] & {"deletionVectors", "columnMapping", "typeWidening",
                                                "typeWidening-preview", "variantType"}


def _retained_table(tmp_path):
    eng = DeltaRsEngine(tmp_path / "tables")
    eng.ensure()
    eng.merge_retained(retained_changes(table([publish("cm/a", b"x", seq=1), publish("cm/b", b"y", seq=2)])),
                       "q", 0)
    return tmp_path / "tables" / "retained"


def _commit(path, *actions: dict) -> None:
    log_dir = path / "_delta_log"
    n = len(list(log_dir.glob("*.json")))
    (log_dir / f"{n:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def _metadata(path, configuration: dict) -> dict:
    """The table's metaData action with ``configuration`` (from its first
    commit); with column mapping, each column's id and physical name (its
    name, as Delta keeps them for the columns a table had when the mode was
    set)."""
    for line in (path / "_delta_log" / f"{0:020d}.json").read_text().splitlines():
        action = json.loads(line)
        if "metaData" in action:
            meta = action["metaData"]
            meta["configuration"] = configuration
            if "delta.columnMapping.mode" in configuration:
                schema = json.loads(meta["schemaString"])
                _annotate(schema, iter(range(1, 1000)))
                meta["schemaString"] = json.dumps(schema)
            return action
    raise AssertionError("no metaData in the first commit")


def _annotate(typ, ids) -> None:
    """Column mapping's id and physical name on every field, nested ones too."""
    if not isinstance(typ, dict):
        return
    for f in typ.get("fields", ()):
        f["metadata"] = {**f.get("metadata", {}), "delta.columnMapping.id": next(ids),
                         "delta.columnMapping.physicalName": f["name"]}
        _annotate(f["type"], ids)
    for key in ("elementType", "keyType", "valueType"):
        _annotate(typ.get(key), ids)


def test_legacy_column_mapping_is_refused_in_one_line_once(tmp_path, caplog):
    """delta-spark 4.4 turns on ``delta.columnMapping.mode = name`` as
    minReaderVersion 2 with no readerFeatures: a check of reader features
    alone lets it through, and a renamed column is then read by its old
    physical name."""
    path = _retained_table(tmp_path)
    _commit(path, {"commitInfo": {"timestamp": 1, "operation": "SET TBLPROPERTIES"}},
            {"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}},
            _metadata(path, {**CM_NAME, "delta.columnMapping.maxColumnId": "19"}))
    store = RetainedStore(path, STREAM, 0.0, 1 << 20)
    with caplog.at_level(logging.ERROR, logger="bridge.edge"):
        store.swap(store.load())
        assert store.snapshot is None
        assert not store.newer()  # refused at this version: the refresh waits for a newer one
        store.load()  # a load again logs nothing new
    err = store.error
    assert err is not None and "\n" not in err
    assert err.startswith(f"retained table {path}: needs reader feature columnMapping "
                          "(delta.columnMapping.mode = name: ")
    assert "own captures only" in err
    assert err.endswith(f"ALTER TABLE delta.`{path}` DROP FEATURE columnMapping")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [err]


def test_a_refused_version_keeps_the_version_served_and_a_readable_one_is_served_again(tmp_path, caplog):
    path = _retained_table(tmp_path)
    store = RetainedStore(path, STREAM, 0.0, 1 << 20)
    store.swap(store.load())
    served = store.snapshot.version
    _commit(path, {"commitInfo": {"timestamp": 1, "operation": "SET TBLPROPERTIES"}},
            {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                          "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"]}},
            _metadata(path, {"delta.enableDeletionVectors": "true"}))
    with caplog.at_level(logging.ERROR, logger="bridge.edge"):
        assert store.newer()
        store.swap(store.load())
    assert store.snapshot.version == served  # the older version, read right, stays
    assert f"still serving table version {served} " in store.error
    assert "reader feature deletionVectors (rows a deletion vector deletes would be served as live)" \
        in store.error
    assert not store.newer()
    # the feature dropped (as Delta 4's DROP FEATURE leaves it: reader version 1)
    _commit(path, {"commitInfo": {"timestamp": 2, "operation": "DROP FEATURE"}},
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 7,
                          "writerFeatures": ["invariants", "appendOnly", "checkpointProtection"]}},
            _metadata(path, {"delta.requireCheckpointProtectionBeforeVersion": str(served + 2)}))
    assert store.newer()
    store.swap(store.load())
    assert store.error is None and store.snapshot.version == served + 2
    assert sorted(store.snapshot.topics.to_pylist()) == ["cm/a", "cm/b"]
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


def test_the_line_docs_retained_md_shows_is_the_line_the_edge_logs(tmp_path):
    from tests.docs.examples import doc_examples

    path = _retained_table(tmp_path)
    _commit(path, {"commitInfo": {"timestamp": 1, "operation": "SET TBLPROPERTIES"}},
            {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                          "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"]}},
            _metadata(path, {"delta.enableDeletionVectors": "true"}))
    store = RetainedStore(path, STREAM, 0.0, 1 << 20)
    store.swap(store.load())
    (shown,) = doc_examples("docs/retained.md", "What the edge reads", lang="")
    assert store.error.replace(str(path), "/data/tables/retained") == shown.strip()
