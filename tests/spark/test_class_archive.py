"""The local JVM's class-data-sharing archive (``bridge.spark.class_archive``):
which archive a session uses, that a real one is mapped by the JVM, and that
a JVM that cannot start with its archive starts without it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bridge.config import load_config
from bridge.spark import class_archive
from tests.conftest import child_env

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, where=None):
    return load_config(None, [f"data_dir={tmp_path / 'data'}",
                              f"spark.class_archive_dir={tmp_path / 'ca' if where is None else where}"], env={})


def _fake_archive(cfg, size: int = 1000, recorded: int | None = None, jars: str | None = None) -> Path:
    path = class_archive.archive_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    jars = jars or str(class_archive._jars_dir())  # noqa: SLF001
    meta = {"bytes": size if recorded is None else recorded, "jars": jars}
    path.with_suffix(".json").write_text(json.dumps(meta))
    return path


def test_no_archive_no_flags_and_an_empty_dir_setting_turns_it_off(tmp_path):
    cfg = _cfg(tmp_path)
    assert class_archive.java_flags(cfg) == []
    off = _cfg(tmp_path, where="")
    assert class_archive.archive_dir(off) is None and class_archive.archive_path(off) is None
    assert class_archive.java_flags(off) == []


def test_a_whole_archive_is_used_one_of_another_size_than_recorded_is_not(tmp_path):
    cfg = _cfg(tmp_path)
    path = _fake_archive(cfg)
    flags = class_archive.java_flags(cfg)
    assert flags[0] == f"-XX:SharedArchiveFile={path}" and "-Xshare:auto" in flags
    _fake_archive(cfg, size=1000, recorded=2000)  # cut short after its record was written
    assert class_archive.java_flags(cfg) == []


def test_the_key_follows_the_jvm_options(tmp_path):
    a = class_archive.archive_path(_cfg(tmp_path))
    b = class_archive.archive_path(load_config(None, [f"spark.class_archive_dir={tmp_path / 'ca'}",
                                                      "spark.java_options=-XX:+UseSerialGC"], env={}))
    assert a.parent == b.parent and a != b


def test_auto_is_the_users_cache_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert class_archive.archive_dir(_cfg(tmp_path, where="auto")) == tmp_path / "xdg" / "lakegate"


def test_without_archive_removes_exactly_the_added_options():
    opts = "-XX:TieredStopAtLevel=1 '-Dx=a b' -XX:SharedArchiveFile=/c/s.jsa -Xshare:auto -Xlog:cds=off " \
           "-Xlog:cds+dynamic=off"
    assert class_archive.without_archive(opts) == "-XX:TieredStopAtLevel=1 '-Dx=a b'"
    assert class_archive.without_archive("-XX:+UseSerialGC") == "-XX:+UseSerialGC"


def test_only_a_jvm_that_exited_before_answering_is_blamed_on_the_archive():
    from pyspark.errors import PySparkRuntimeError

    assert class_archive.jvm_did_not_start(PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED",
                                                               messageParameters={}))
    assert class_archive.jvm_did_not_start(RuntimeError("Java gateway process exited before sending its port"))
    # a session that fails for another reason keeps its archive: the retry without it would not help
    assert not class_archive.jvm_did_not_start(PySparkRuntimeError(errorClass="CANNOT_CONFIGURE_SPARK_CONNECT",
                                                                   messageParameters={"existing_url": "x",
                                                                                      "new_url": "y"}))
    assert not class_archive.jvm_did_not_start(ValueError("spark.sql.shuffle.partitions must be positive"))


def test_prune_keeps_one_archive_per_environment(tmp_path):
    cfg = _cfg(tmp_path)
    kept = _fake_archive(cfg)
    d = kept.parent
    superseded = d / "spark-0000000000000000.jsa"
    gone = d / "spark-1111111111111111.jsa"
    other = d / "spark-2222222222222222.jsa"
    ours = str(class_archive._jars_dir())  # noqa: SLF001
    for p, jars in ((superseded, ours), (gone, str(tmp_path / "deleted-venv" / "jars")), (other, str(tmp_path))):
        p.write_bytes(b"x")
        p.with_suffix(".json").write_text(json.dumps({"bytes": 1, "jars": jars}))
    class_archive._prune(kept)  # noqa: SLF001
    assert sorted(p.name for p in d.glob("*.jsa")) == sorted([kept.name, other.name])
    assert not superseded.with_suffix(".json").exists() and not gone.with_suffix(".json").exists()


_SESSION = textwrap.dedent("""
    import sys
    from bridge.config import load_config
    from bridge.spark.session import build_session
    cfg = load_config(None, [f"data_dir={sys.argv[1]}", f"spark.class_archive_dir={sys.argv[2]}",
                             "log_level=WARNING"], env={})
    spark = build_session(cfg, app_name="archive-test")
    pid = spark.sparkContext._gateway.proc.pid
    maps = open(f"/proc/{pid}/maps").read()
    print("MAPPED" if sys.argv[3] in maps else "NOT-MAPPED", spark.range(3).count(), flush=True)
    spark.stop()
""")


def _session(tmp_path, archive: Path) -> subprocess.CompletedProcess:
    # cwd: where a crashing JVM writes its hs_err_pid*.log
    return subprocess.run([sys.executable, "-c", _SESSION, str(tmp_path / "data"), str(archive.parent), str(archive)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=child_env())


@pytest.mark.spark
@pytest.mark.subprocess
@pytest.mark.slow
def test_jvm_archive_makes_an_archive_the_jvm_maps_and_a_damaged_one_is_set_aside(tmp_path):
    if not Path("/proc/self/maps").exists():
        pytest.skip("needs /proc to see what the JVM mapped")
    where = tmp_path / "ca"
    made = subprocess.run([sys.executable, "-m", "bridge", "jvm-archive", "--set", f"spark.class_archive_dir={where}",
                           "--set", "log_level=WARNING"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=child_env())
    assert made.returncode == 0, made.stdout + made.stderr
    archive = class_archive.archive_path(_cfg(tmp_path))
    assert str(archive) in made.stdout and archive.stat().st_size > 10_000_000
    assert json.loads(archive.with_suffix(".json").read_text())["bytes"] == archive.stat().st_size
    assert not list(where.glob(".*.tmp"))

    used = _session(tmp_path, archive)
    assert used.returncode == 0 and "MAPPED 3" in used.stdout, used.stdout + used.stderr[-3000:]

    again = subprocess.run([sys.executable, "-m", "bridge", "jvm-archive", "--set", f"spark.class_archive_dir={where}",
                            "--check"], capture_output=True, text=True, timeout=60, cwd=ROOT, env=child_env())
    assert again.returncode == 0 and "(usable)" in again.stdout, again.stdout + again.stderr

    # damaged, its record agreeing: HotSpot crashes on it (SIGBUS); the session starts again without it
    with open(archive, "r+b") as fh:
        fh.truncate(archive.stat().st_size // 2)
    archive.with_suffix(".json").write_text(json.dumps({"bytes": archive.stat().st_size}))
    crashed = _session(tmp_path, archive)
    assert crashed.returncode == 0 and "NOT-MAPPED 3" in crashed.stdout, crashed.stdout + crashed.stderr[-3000:]
    assert "did not start with the class archive" in crashed.stderr, crashed.stderr[-3000:]
    assert not archive.exists() and archive.with_suffix(".unusable").exists()
    assert list(tmp_path.glob("hs_err_pid*.log")), "the JVM did not crash on the damaged archive: nothing tested"
