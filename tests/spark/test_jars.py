"""The JVM jar groups (bridge/spark/jars.py) and what stops a command for them.

Fake ``.jvm/`` folders through ``LAKEGATE_JVM_DIR`` and a fake pyspark
``jars/`` folder (Spark 4.2 / Scala 2.13) for the checks and for ``lakegate
doctor``; ``lakegate process`` / ``run`` asked for delta-spark without its
jars stop before any JVM. Three spark-submit runs show what the job says
of the jars it was given (docs/job.md, "JVM jars under spark-submit").
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.cli import main
from bridge.spark import jars
from tests.conftest import child_env

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _touch(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"PK")
    return folder


@pytest.fixture
def spark_jars(tmp_path, monkeypatch) -> Path:
    """A pyspark ``jars/`` of Spark 4.2.0 / Scala 2.13 that ships jackson-core and hadoop-client-api."""
    folder = _touch(tmp_path / "pyspark-jars", "spark-core_2.13-4.2.0.jar", "jackson-core-2.18.2.jar",
                    "hadoop-client-api-3.4.2.jar")
    monkeypatch.setattr(jars, "spark_jars_dir", lambda: folder)
    return folder


@pytest.fixture
def jvm(tmp_path, monkeypatch) -> Path:
    """An empty ``.jvm/`` for LAKEGATE_JVM_DIR; the once-per-process notes forgotten."""
    folder = tmp_path / "jvm"
    folder.mkdir()
    monkeypatch.setenv("LAKEGATE_JVM_DIR", str(folder))
    monkeypatch.setattr(jars, "_SAID", set())
    return folder


def _complete(jvm: Path) -> None:
    _touch(jvm / "lib" / "delta", "delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar")
    _touch(jvm / "lib" / "kafka", "spark-sql-kafka-0-10_2.13-4.2.0.jar", "kafka-clients-3.9.2.jar")


def test_prune_takes_out_what_spark_ships_whatever_its_version(spark_jars, tmp_path):
    group = _touch(tmp_path / "delta", "delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar",
                   "jackson-core-2.13.5.jar", "hadoop-client-api-3.3.4.jar")
    assert jars.prune(group, spark_jars) == ["hadoop-client-api-3.3.4.jar", "jackson-core-2.13.5.jar"]
    assert sorted(p.name for p in group.iterdir()) == ["delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"]


def test_a_missing_group_is_one_line_naming_the_artifact_and_the_command(spark_jars, jvm):
    assert jars.problems("delta") == [
        f"delta-spark jar missing in {jvm}/lib/delta/ (for {jars.GROUPS['delta'].purpose}): "
        "run scripts/bootstrap (Maven, jvm/pom.xml)"]
    assert jars.problems("kafka", purpose=False) == [
        f"spark-sql-kafka-0-10 jar missing in {jvm}/lib/kafka/: run scripts/bootstrap (Maven, jvm/pom.xml)"]
    _touch(jvm / "lib" / "delta", "delta-storage-4.4.0.jar")  # the folder without its main jar
    assert jars.problems("delta")[0].startswith("delta-spark jar missing")


def test_a_jar_of_another_spark_or_scala_line_is_named_with_both_lines(spark_jars, jvm):
    _touch(jvm / "lib" / "delta", "delta-spark_4.1_2.13-4.0.0.jar")
    _touch(jvm / "lib" / "kafka", "spark-sql-kafka-0-10_2.12-4.2.0.jar")
    assert jars.problems("delta") == [
        f"delta-spark_4.1_2.13-4.0.0.jar in {jvm}/lib/delta/ is for Spark 4.1 / Scala 2.13, but pyspark is "
        "Spark 4.2 / Scala 2.13: run scripts/bootstrap (Maven, jvm/pom.xml) for the version pinned for it"]
    assert "is for Spark 4.2 / Scala 2.12, but pyspark is Spark 4.2 / Scala 2.13" in jars.problems("kafka")[0]


def test_complete_groups_have_no_problem_and_a_summary_with_versions(spark_jars, jvm):
    _complete(jvm)
    assert jars.problems("delta") == [] and jars.problems("kafka") == []
    assert jars.summary("delta") == "2 jars: delta-spark_4.2_2.13 4.4.0, delta-storage 4.4.0"
    assert jars.summary("kafka") == "2 jars: kafka-clients 3.9.2, spark-sql-kafka-0-10_2.13 4.2.0"


def test_the_jars_spark_submit_was_given_are_checked_by_name_wherever_they_come_from():
    listed = ["file:/ivy/jars/io.delta_delta-spark_4.1_2.13-4.0.0.jar",  # --packages (Ivy's names)
              "spark://10.0.0.1:40000/jars/spark-sql-kafka-0-10_2.12-4.2.0.jar",
              "/srv/lakegate/.jvm/lib/delta/delta-storage-4.4.0.jar", ""]
    assert jars.listed_problems(listed, "4.2.0", "2.13.16") == [
        "io.delta_delta-spark_4.1_2.13-4.0.0.jar (spark.jars) is for Spark 4.1 / Scala 2.13, but this "
        "spark-submit is Spark 4.2 / Scala 2.13: run scripts/bootstrap (Maven, jvm/pom.xml) for the version pinned for it",
        "spark-sql-kafka-0-10_2.12-4.2.0.jar (spark.jars) is for Spark 4.2 / Scala 2.12, but this spark-submit is "
        "Spark 4.2 / Scala 2.13: run scripts/bootstrap (Maven, jvm/pom.xml) for the version pinned for it"]
    assert jars.listed_problems(["/x/delta-spark_4.2_2.13-4.4.0.jar", "/x/spark-sql-kafka-0-10_2.13-4.2.1.jar"],
                                "4.2.1", "2.13.16") == []


def test_a_local_session_gets_the_usable_groups_and_hears_once_what_is_missing(spark_jars, jvm, caplog):
    _touch(jvm / "lib" / "kafka", "spark-sql-kafka-0-10_2.13-4.2.0.jar", "kafka-clients-3.9.2.jar")
    with caplog.at_level(logging.INFO, logger="bridge.spark.jars"):
        conf = jars.spark_conf()
        assert jars.spark_conf() == conf  # the second time says nothing
    assert conf == {"spark.jars": f"{jvm}/lib/kafka/kafka-clients-3.9.2.jar,{jvm}/lib/kafka/spark-sql-kafka-0-10_2.13-4.2.0.jar"}
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"spark: delta-spark jar missing in {jvm}/lib/delta/ (for {jars.GROUPS['delta'].purpose}): "
                    "run scripts/bootstrap (Maven, jvm/pom.xml); tables go through delta-rs"]
    _complete(jvm)
    conf = jars.spark_conf()
    assert conf["spark.jars"].split(",") == [str(p) for g in ("delta", "kafka") for p in jars.jars(g)]
    assert {k: conf[k] for k in jars.DELTA_SQL_CONF} == jars.DELTA_SQL_CONF


def test_the_spark_submit_options_name_the_jars_when_they_live_outside_the_checkout(monkeypatch, tmp_path):
    monkeypatch.delenv("LAKEGATE_JVM_DIR", raising=False)
    assert jars.submit_options() == ["--properties-file", "conf/spark-defaults.conf"]
    monkeypatch.setenv("LAKEGATE_JVM_DIR", str(tmp_path))
    assert jars.submit_options() == ["--properties-file", "conf/spark-defaults.conf", "--jars",
                                     f"{tmp_path}/lib/delta/*.jar,{tmp_path}/lib/kafka/*.jar"]


def test_the_properties_file_names_the_jar_folders_and_deltas_sql_settings():
    conf = {}
    for line in (ROOT / "conf" / "spark-defaults.conf").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split(None, 1)
            conf[key] = value.strip()
    assert conf["spark.jars"] == ",".join(f".jvm/lib/{g}/*.jar" for g in jars.GROUPS)
    assert {k: conf[k] for k in jars.DELTA_SQL_CONF} == jars.DELTA_SQL_CONF


def _doctor(capsys, *sets: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["doctor", *[a for s in sets for a in ("--set", s)]])
    return code, capsys.readouterr().out.splitlines()


def test_doctor_lists_the_groups_with_their_jars_and_the_spark_submit_line(spark_jars, jvm, tmp_path, capsys):
    _complete(jvm)
    code, out = _doctor(capsys, f"data_dir={tmp_path / 'data'}", "amqp.url=")
    assert f"ok    jvm jars delta ({jvm}/lib/delta): 2 jars: delta-spark_4.2_2.13 4.4.0, delta-storage 4.4.0" in out
    assert f"ok    jvm jars kafka ({jvm}/lib/kafka): 2 jars: kafka-clients 3.9.2, spark-sql-kafka-0-10_2.13 4.2.0" in out
    assert (f"info  spark-submit (from {ROOT}): spark-submit --properties-file conf/spark-defaults.conf --jars "
            f"'{jvm}/lib/delta/*.jar,{jvm}/lib/kafka/*.jar' jobs/process_packets.py --config conf/lakegate.toml") in out
    _exit_says_the_fail_lines(code, out)


def _exit_says_the_fail_lines(code: int, out: list[str]) -> None:
    """1 when a FAIL line is there (Java, a package ... of this machine too), else 0; no FAIL for the jars."""
    assert not [ln for ln in out if ln.startswith("FAIL  jvm jars")], out
    assert code == (1 if any(ln.startswith("FAIL") for ln in out) else 0), out


def test_doctor_warns_of_a_missing_group_and_fails_when_delta_spark_is_asked_for(spark_jars, jvm, tmp_path, capsys):
    code, out = _doctor(capsys, f"data_dir={tmp_path / 'data'}", "amqp.url=")
    delta = [ln for ln in out if ln.startswith(("ok    jvm jars delta", "warn  jvm jars delta", "FAIL  jvm jars delta"))]
    assert delta == [f"warn  jvm jars delta: delta-spark jar missing in {jvm}/lib/delta/ (for "
                     f"{jars.GROUPS['delta'].purpose}): run scripts/bootstrap (Maven, jvm/pom.xml); "
                     "tables go through delta-rs"], out
    _exit_says_the_fail_lines(code, out)  # the embedded default runs without it: a warning
    code, out = _doctor(capsys, f"data_dir={tmp_path / 'data'}", "amqp.url=", "tables.engine=delta-spark")
    assert any(ln.startswith("FAIL  jvm jars delta: delta-spark jar missing") for ln in out), out
    assert code == 1 and out[-1] == "some prerequisites are missing (see FAIL lines)"


def test_doctor_fails_on_a_jar_of_another_spark_line(spark_jars, jvm, tmp_path, capsys):
    _complete(jvm)
    _touch(jvm / "lib" / "kafka", "spark-sql-kafka-0-10_2.13-4.1.0.jar")
    code, out = _doctor(capsys, f"data_dir={tmp_path / 'data'}", "amqp.url=")
    assert (f"FAIL  jvm jars kafka: spark-sql-kafka-0-10_2.13-4.1.0.jar in {jvm}/lib/kafka/ is for Spark 4.1 / "
            "Scala 2.13, but pyspark is Spark 4.2 / Scala 2.13: run scripts/bootstrap (Maven, jvm/pom.xml) for "
            "the version pinned for it") in out
    assert code == 1


@pytest.mark.parametrize("command", ["process", "run"])
def test_process_and_run_asked_for_delta_spark_without_its_jars_stop_in_one_line(command, jvm, tmp_path, capfd):
    capfd.readouterr()
    code = main([command, "--set", f"data_dir={tmp_path}", "--set", "tables.engine=delta-spark",
                 "--set", "amqp.url=", "--set", "sql.connect_port=0", "--set", "metrics.port=0"])
    err = capfd.readouterr().err
    assert code == 2, err
    assert err.splitlines() == [
        f"lakegate: tables.engine = delta-spark (from --set tables.engine), but delta-spark jar missing in "
        f"{jvm}/lib/delta/: run scripts/bootstrap (Maven, jvm/pom.xml)"]
    assert not (tmp_path / "run.pid").exists() and not (tmp_path / "checkpoints").exists()


@pytest.mark.spark
def test_the_spark_version_is_read_from_the_jvm(spark, monkeypatch):
    import pyspark

    from bridge.spark.session import _spark_version

    monkeypatch.setattr(pyspark, "__version__", "0.0.0")  # the fallback, which must not be what answers
    assert _spark_version(spark.sparkContext._jvm) == spark.version  # noqa: SLF001 - py4j handle


# -- under spark-submit -------------------------------------------------------------------------------------


def _submit(cwd: Path, data_dir: Path, *options: str, sets: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """jobs/process_packets.py --once under spark-submit, the venv active (docs/job.md)."""
    env = child_env(PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
                    VIRTUAL_ENV=str(VENV_BIN.parent), SPARK_LOCAL_IP="127.0.0.1")
    env.pop("SPARK_HOME", None)
    sets = ("amqp.url=", f"data_dir={data_dir}", *sets)
    return subprocess.run(
        [str(VENV_BIN / "spark-submit"), "--properties-file", str(ROOT / "conf" / "spark-defaults.conf"), *options,
         str(ROOT / "jobs" / "process_packets.py"), "--config", str(ROOT / "conf" / "lakegate.toml"),
         *[a for s in sets for a in ("--set", s)], "--once"],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def _no_java_trace(out: str) -> None:
    assert not [ln for ln in out.splitlines() if ln.startswith(("\tat ", "Traceback", "Exception in thread"))], out


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.slow
def test_spark_submit_given_a_delta_spark_jar_of_another_spark_line_stops_in_one_line(tmp_path):
    fake = tmp_path / "delta-spark_4.1_2.13-4.0.0.jar"  # a real jar (Spark's tags) under that name: the name is checked
    fake.write_bytes(next(jars.spark_jars_dir().glob("spark-tags_*.jar")).read_bytes())
    job = _submit(ROOT, tmp_path / "data", "--jars", str(fake))
    out = job.stdout + job.stderr
    assert job.returncode == 2, out[-3000:]
    ours = [ln for ln in out.splitlines() if ln.startswith("lakegate:")]
    assert ours == ["lakegate: delta-spark_4.1_2.13-4.0.0.jar (spark.jars) is for Spark 4.1 / Scala 2.13, but this "
                    "spark-submit is Spark 4.2 / Scala 2.13: run scripts/bootstrap (Maven, jvm/pom.xml) for the "
                    "version pinned for it"], out[-3000:]
    _no_java_trace(out)
    assert not (tmp_path / "data" / "checkpoints").exists()


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.slow
def test_spark_submit_elsewhere_than_the_checkout_finds_no_jars_and_says_so(tmp_path):
    """The file's globs are relative: from another directory they match
    nothing. delta-spark asked for: one line, exit 2; else delta-rs, said once."""
    from tests.job.frames import append_publish
    from bridge.capture import CaptureLog
    from bridge.config import load_config

    job = _submit(tmp_path, tmp_path / "data", sets=("tables.engine=delta-spark",))
    out = job.stdout + job.stderr
    assert job.returncode == 2, out[-3000:]
    assert [ln for ln in out.splitlines() if ln.startswith("lakegate:")] == [
        "lakegate: tables.engine = delta-spark (from --set tables.engine), but delta-spark is not on "
        "spark-submit's classpath (0 jars in spark.jars, none of them delta-spark_*.jar): run scripts/bootstrap "
        "(Maven, jvm/pom.xml), then submit from the checkout with --properties-file conf/spark-defaults.conf "
        "(docs/job.md)"], out[-3000:]
    _no_java_trace(out)

    cfg = load_config(None, [f"data_dir={tmp_path / 'data'}"], env={})
    log = CaptureLog.open(cfg.capture_dir, cfg.capture)
    for ack in [append_publish(log, "c1", "dev/1", b"v%d" % i, packet_id=1 + i) for i in range(5)]:
        ack.wait(10)
    log.close()
    job = _submit(tmp_path, tmp_path / "data")
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-3000:]
    said = [ln for ln in out.splitlines() if "delta-spark is not on spark-submit's classpath" in ln]
    assert len(said) == 1 and "its SQL extension and catalog left out; tables go through delta-rs" in said[0], out
    assert "engine=delta-rs" in out
    _no_java_trace(out)
    from deltalake import DeltaTable

    assert DeltaTable(str(tmp_path / "data" / "tables" / "messages")).to_pyarrow_table().num_rows == 5
