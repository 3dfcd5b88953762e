"""``lakegate sql`` from the command line: bad input is one line, --format json/csv;
with delta-spark (the tests' session has its jars unless .jvm/lib/delta is
empty: those tests skip, saying so) the tables are Delta tables in the
session's catalog: DESCRIBE HISTORY, VERSION AS OF, OPTIMIZE as
``sql.allow_maintenance`` says.

Most tests run the CLI's ``main`` in this process on the tests' Spark session
(``lakegate sql`` would stop it at the end: ``stop`` is a no-op here) and
capture what the command prints. The JVM of that session writes to the
stderr it was started with, so the subprocess tests run ``python -m bridge
sql`` for the whole, real stderr of bad input.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import json
import re
import subprocess
import sys

import pytest

from bridge.cli import main
from bridge.tables.deltars import DeltaRsEngine
from bridge.tables.retained_rule import retained_changes
from tests.tables.rows import T0, publish, table

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("bridge_log_level")]

# The JVM itself (not lakegate) prints this on startup when Spark adds the
# incubator vector module; it is no part of the command's answer.
JVM_NOTICE = re.compile(r"^WARNING: Using incubator modules: ")


@pytest.fixture
def data_dir(tmp_path):
    """Tables with three retained versions: 0 (created), 1 (a=v1), 2 (a=v2, b=hi; 'c' removed)."""
    data = tmp_path / "data"
    engine = DeltaRsEngine(data / "tables")
    engine.ensure()
    first = [publish("a", b"v1", seq=1), publish("c", b"x", seq=2)]
    second = [publish("a", b"v2", seq=3), publish("b", b"hi", seq=4, content_type="text/plain"),
              publish("c", b"", seq=5)]
    engine.append("messages", table(first), "q", 0)
    engine.merge_retained(retained_changes(table(first)), "q", 0)
    engine.append("messages", table(second), "q", 1)
    engine.merge_retained(retained_changes(table(second)), "q", 1)
    return data


@pytest.fixture
def lakegate_sql(spark, data_dir, monkeypatch, capfd):
    """Run ``lakegate sql ARGS`` in-process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(spark, "stop", lambda: None)
    capfd.readouterr()

    def run(*argv: str):
        code = main(["sql", "--set", f"data_dir={data_dir}", "--set", "spark.master=local[2]",
                     "--set", "spark.shuffle_partitions=2", *argv])
        out = capfd.readouterr()
        return code, out.out, out.err

    return run


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not JVM_NOTICE.match(ln)]
    assert "Traceback" not in err
    assert len(lines) == 1, f"stderr is not one line:\n{err}"
    return lines[0]


def test_unknown_table_is_sparks_message_in_one_line(lakegate_sql):
    code, out, err = lakegate_sql("SELECT * FROM retaind")
    line = one_line(err)
    assert code == 2 and out == ""
    assert line.startswith("lakegate: sql: [TABLE_OR_VIEW_NOT_FOUND] ") and "`retaind`" in line


def test_unknown_column_is_sparks_message_in_one_line(lakegate_sql):
    code, out, err = lakegate_sql("SELECT topik FROM retained")
    line = one_line(err)
    assert code == 2 and out == ""
    assert line.startswith("lakegate: sql: [UNRESOLVED_COLUMN") and "`topik`" in line
    assert "SQLSTATE: 42703" in line


def test_syntax_error_is_one_line(lakegate_sql):
    code, _, err = lakegate_sql("SELEC topic FROM retained")
    assert code == 2 and one_line(err).startswith("lakegate: sql: [PARSE_SYNTAX_ERROR] ")


def test_as_of_a_missing_version_names_oldest_and_newest(lakegate_sql):
    code, out, err = lakegate_sql("SELECT * FROM retained", "--as-of", "7")
    assert code == 2 and out == ""
    assert one_line(err) == "lakegate: retained: version 7 does not exist (oldest 0, newest 2)"


def test_as_of_a_time_before_the_first_commit_is_one_line(lakegate_sql):
    code, out, err = lakegate_sql("SELECT * FROM retained", "--as-of", "2020-01-01T00:00:00Z")
    assert code == 2 and out == ""
    assert re.fullmatch(r"lakegate: retained: no version at or before 2020-01-01T00:00:00\.000Z "
                        r"\(oldest 0 committed \S+Z, newest 2 committed \S+Z\)", one_line(err))


def test_as_of_text_that_is_no_time_is_one_line(lakegate_sql):
    code, _, err = lakegate_sql("SELECT * FROM messages", "--as-of", "yesterday")
    assert code == 2
    assert one_line(err) == "lakegate: --as-of 'yesterday' is neither a version number nor an ISO timestamp"


def test_format_json_is_one_array_of_row_objects(lakegate_sql):
    code, out, err = lakegate_sql("SELECT topic, payload, content_type, set_at, seq FROM retained ORDER BY topic",
                                  "--format", "json")
    assert code == 0, err
    assert err == ""
    assert out.count("\n") == 1 and out.endswith("\n")
    rows = json.loads(out)
    assert rows == [
        {"topic": "a", "payload": base64.b64encode(b"v2").decode(), "content_type": None,
         "set_at": (T0 + dt.timedelta(seconds=3)).replace(tzinfo=None).isoformat(), "seq": 3},
        {"topic": "b", "payload": base64.b64encode(b"hi").decode(), "content_type": "text/plain",
         "set_at": (T0 + dt.timedelta(seconds=4)).replace(tzinfo=None).isoformat(), "seq": 4},
    ]


def test_format_json_with_as_of_and_an_empty_result(lakegate_sql):
    code, out, _ = lakegate_sql("SELECT topic, CAST(payload AS STRING) AS p FROM retained ORDER BY topic",
                                "--format", "json", "--as-of", "1")
    assert code == 0 and json.loads(out) == [{"topic": "a", "p": "v1"}, {"topic": "c", "p": "x"}]
    code, out, _ = lakegate_sql("SELECT topic FROM retained WHERE topic = 'nothing'", "--format", "json")
    assert code == 0 and out == "[]\n"


def test_format_csv_has_a_header_hex_binaries_and_empty_nulls(lakegate_sql):
    code, out, err = lakegate_sql("SELECT topic, payload, content_type, deleted FROM retained_all ORDER BY topic",
                                  "--format", "csv")
    assert code == 0, err
    assert err == ""
    assert list(csv.reader(io.StringIO(out))) == [
        ["topic", "payload", "content_type", "deleted"],
        ["a", "0x7632", "", "False"],
        ["b", "0x6869", "text/plain", "False"],
        ["c", "", "", "True"],
    ]


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("argv, expected", [
    (["SELECT nope FROM retained"], r"lakegate: sql: \[UNRESOLVED_COLUMN\.WITH_SUGGESTION\] .*`nope`.*"),
    (["SELECT * FROM retained", "--as-of", "2020-01-01T00:00:00Z"],
     r"lakegate: retained: no version at or before 2020-01-01T00:00:00\.000Z \(oldest 0 committed \S+, newest 2 committed \S+\)"),
], ids=["unknown-column", "as-of-before-first-commit"])
def test_the_real_command_prints_one_line_and_no_stack(data_dir, argv, expected):
    proc = subprocess.run(
        [sys.executable, "-m", "bridge", "sql", "--set", f"data_dir={data_dir}", "--set", "spark.master=local[1]", *argv],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert re.fullmatch(expected, one_line(proc.stderr))


def test_retained_versions_shows_the_capture_offsets_each_version_covers(lakegate_sql, data_dir):
    from bridge.tables.coverage import coverage_metadata

    engine = DeltaRsEngine(data_dir / "tables")
    engine.merge_retained(retained_changes(table([publish("d", b"z", seq=9)])), "q", 2,
                          coverage_metadata("mqtt-frames", {0: 12, 1: 3}, "q", 2))
    code, out, err = lakegate_sql("SELECT version, stream, capture_offsets, batch FROM retained_versions "
                                  "ORDER BY version DESC LIMIT 2", "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert rows[0]["stream"] == "mqtt-frames" and rows[0]["batch"] == 2
    assert rows[0]["capture_offsets"] == {"0": 12, "1": 3}
    assert rows[1]["stream"] is None  # written without coverage


@pytest.fixture
def delta_spark(spark):
    from bridge.spark.session import DELTA_CLASS, delta_spark_available

    if not delta_spark_available(spark):
        pytest.skip(f"delta-spark's JVM classes ({DELTA_CLASS}) are not on the classpath: .jvm/lib/delta is empty "
                    "(scripts/bootstrap resolves it)")
    return spark


def test_with_delta_spark_the_tables_have_history_and_time_travel(delta_spark, lakegate_sql):
    code, out, err = lakegate_sql("DESCRIBE HISTORY messages", "--format", "json")
    assert code == 0, err
    assert [(r["version"], r["operation"]) for r in json.loads(out)] == [(2, "WRITE"), (1, "WRITE"),
                                                                          (0, "CREATE TABLE")]
    code, out, err = lakegate_sql("SELECT count(*) AS n FROM messages VERSION AS OF 1", "--format", "json")
    assert code == 0 and json.loads(out) == [{"n": 2}], err
    code, out, _ = lakegate_sql("SELECT topic FROM retained_all VERSION AS OF 1 WHERE NOT deleted ORDER BY topic",
                                "--format", "csv")
    assert out.split() == ["topic", "a", "c"]


def test_history_of_the_retained_view_is_the_history_of_its_table_and_says_so(delta_spark, lakegate_sql):
    code, out, err = lakegate_sql("DESCRIBE HISTORY retained", "--format", "csv")
    assert code == 0, err
    assert out.startswith("version,timestamp,") and "the history of retained_all" in err


def test_optimize_is_refused_in_one_line_unless_the_configuration_allows_it(delta_spark, lakegate_sql, data_dir):
    from deltalake import DeltaTable

    code, out, err = lakegate_sql("OPTIMIZE messages")
    assert code == 2 and out == ""
    assert one_line(err) == ("lakegate: sql: OPTIMIZE through SQL is off: sql.allow_maintenance = false in the "
                             "configuration of the lakegate process serving this SQL (lakegate compact runs OPTIMIZE "
                             "and VACUUM)")
    code, out, err = lakegate_sql("--set", "sql.allow_maintenance=true", "OPTIMIZE messages", "--format", "csv")
    assert code == 0, err
    assert out.startswith("path,metrics\n")
    messages = DeltaTable(str(data_dir / "tables" / "messages"))
    assert messages.history(1)[0]["operation"] == "OPTIMIZE" and len(messages.file_uris()) == 1
    code, _, err = lakegate_sql("--set", "sql.allow_maintenance=true", "VACUUM messages RETAIN 1 HOURS")
    assert code == 2
    assert one_line(err) == ("lakegate: sql: VACUUM ... RETAIN 1.0 HOURS is below tables.vacuum_retention_hours = "
                             "168 (readers and time travel may still need those files)")
