"""A class-data-sharing archive for the local Spark JVM (Java's AppCDS).

A local session's JVM spends most of its start loading and verifying the
classes of Spark's 277 jars: 4.1-4.4 s to the SparkSession and 1.6 s more to
the SQL session's first use on the 2-core machine. With a dynamic CDS archive
of those classes (``-XX:SharedArchiveFile``) the same start took 2.4 s and
1.4 s (README, "The local JVM").

- ``lakegate jvm-archive`` (and ``scripts/bootstrap``) makes one: a short
  training run in a child process (:func:`train`: a local session, the
  ``lakegate`` source, one micro-batch through the job's pandas UDF and one
  on the driver, the SQL endpoint's plugin) whose JVM dumps the classes it
  loaded when it exits (``-XX:ArchiveClassesAtExit``). The archive is
  written under a temporary name and renamed only after that JVM exited
  with status 0, beside a small JSON file with its size: a truncated archive
  makes HotSpot crash at start (SIGBUS, measured), so one whose size differs
  is never used.
- Every local session (``lakegate run``, ``process``, ``sql``, the tests)
  uses the archive when there is one for its key: the java executable's
  JVM library, pyspark's version and jars, and ``spark.java_options``
  (:func:`archive_path`). Anything else Java checks itself (its build, the
  class path): an archive it cannot use is ignored, with its warning
  silenced, and the JVM starts as without. Under spark-submit the
  submitter's JVM options win; nothing here applies.

``spark.class_archive_dir`` (default ``auto``: ``$XDG_CACHE_HOME/lakegate``,
else ``~/.cache/lakegate``) holds the archives (about 120 MB each); ``""``
turns their use off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bridge.config import Config

__all__ = ["archive_dir", "archive_path", "build", "java_flags", "set_aside", "usable_archive", "without_archive"]

log = logging.getLogger(__name__)

#: JVM options that use an archive: unusable (another JDK build, another
#: class path) means started without it, silently (``-Xshare:auto``)
USE_FLAGS = ("-Xshare:auto", "-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def archive_dir(config: Config) -> Path | None:
    """Where archives live; None when ``spark.class_archive_dir`` is ``""``."""
    where = config.spark.class_archive_dir
    if not where:
        return None
    if where == "auto":
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "lakegate"
    return Path(where).expanduser()


def _key(config: Config) -> str | None:
    """What the archive depends on (the JVM library, the jars with their
    sizes and times, pyspark's version, the JVM options); None when there is
    no java to start. Java checks most of it again itself."""
    import pyspark

    from bridge.javacheck import find_java

    java = find_java()
    if java is None:
        return None
    real = Path(java).resolve()
    parts = [str(real)]
    for lib in (real.parent.parent / "lib" / "server" / "libjvm.so", real):
        try:
            st = lib.stat()
            parts.append(f"{lib}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            continue
    jars = _jars_dir()
    parts.append(str(jars))  # Java checks each jar's path, size and mtime against the archive's
    try:
        parts += sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars.iterdir())
    except OSError:
        pass
    parts += [pyspark.__version__, config.spark.java_options]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _jars_dir() -> Path:
    import pyspark

    return (Path(pyspark.__file__).parent / "jars").resolve()


def archive_path(config: Config) -> Path | None:
    """The archive for this JVM, Spark and ``spark.java_options`` (it may not exist yet)."""
    where = archive_dir(config)
    key = _key(config) if where is not None else None
    if where is None or key is None:
        return None
    return where / f"spark-{key}.jsa"


def usable_archive(config: Config) -> Path | None:
    """The archive when it exists whole (the size its JSON file recorded)."""
    path = archive_path(config)
    if path is None:
        return None
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
        return path if path.stat().st_size == int(meta["bytes"]) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def java_flags(config: Config) -> list[str]:
    """JVM options that use the archive, or [] when there is none."""
    path = usable_archive(config)
    return [f"-XX:SharedArchiveFile={path}", *USE_FLAGS] if path is not None else []


def without_archive(java_options: str) -> str:
    """``java_options`` (one string, shell-quoted) without the options :func:`java_flags` adds."""
    import shlex

    opts = shlex.split(java_options)
    kept = [o for o in opts if not o.startswith("-XX:SharedArchiveFile=") and o not in USE_FLAGS]
    return shlex.join(kept) if kept != opts else java_options


def jvm_did_not_start(error: BaseException) -> bool:
    """Whether ``error`` is pyspark's "the JVM exited before it answered"
    (``JAVA_GATEWAY_EXITED``): what a JVM that crashes on its class archive
    gives. Any other failure of a session's start is not the archive's."""
    get = getattr(error, "getCondition", None) or getattr(error, "getErrorClass", None)
    try:
        if callable(get) and get() == "JAVA_GATEWAY_EXITED":
            return True
    except Exception:  # noqa: BLE001 - an exception type of another pyspark: judge by the text below
        pass
    return "Java gateway process exited" in str(error)


def set_aside(config: Config, error: BaseException) -> None:
    """The JVM did not start with the archive: rename it (``*.unusable``) so
    that no later start uses it, and say so in one line."""
    path = archive_path(config)
    if path is None:
        return
    aside = path.with_suffix(".unusable")
    try:
        os.replace(path, aside)
        path.with_suffix(".json").unlink(missing_ok=True)
    except OSError:
        pass
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    log.warning("spark: the JVM did not start with the class archive %s (%s); starting without it, the archive "
                "set aside as %s (lakegate jvm-archive makes a new one)", path, first, aside.name)


def build(config: Config, *, timeout: float = 300.0) -> Path:
    """Make the archive for ``config`` (a training run in a child process);
    returns its path. Raises RuntimeError saying why it could not."""
    path = archive_path(config)
    if path is None:
        raise RuntimeError("no archive to make: spark.class_archive_dir is empty, or there is no java")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="lakegate-jvm-archive-") as work:
            cmd = [sys.executable, "-m", "bridge.commands.jvm_archive_train", "--dump-to", str(tmp), "--work", work,
                   "--java-options", config.spark.java_options]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if out.returncode != 0 or not tmp.exists() or tmp.stat().st_size == 0:
                tail = (out.stderr or out.stdout or "").strip().splitlines()[-5:]
                raise RuntimeError(f"the training run exited {out.returncode} without an archive: "
                                   + " | ".join(tail)[:600])
        size = tmp.stat().st_size
        path.with_suffix(".json").write_text(json.dumps({
            "bytes": size, "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "jars": str(_jars_dir()),
            "java_options": config.spark.java_options, "seconds": round(time.monotonic() - started, 1)}))
        os.replace(tmp, path)  # a JVM that has the old one mapped keeps it
        _prune(path)
        log.info("jvm archive: %s (%d bytes) in %.1f s", path, size, time.monotonic() - started)
        return path
    finally:
        tmp.unlink(missing_ok=True)


def _prune(kept: Path) -> None:
    """Remove the archives no start can use any more: those made for the same
    jars (superseded: another Java, other jars or options) and those whose
    jars are gone (a deleted virtual environment), so the directory holds
    about one archive per environment in use."""
    jars = str(_jars_dir())
    for meta_file in kept.parent.glob("spark-*.json"):
        archive = meta_file.with_suffix(".jsa")
        if archive == kept:
            continue
        try:
            made_for = json.loads(meta_file.read_text()).get("jars")
        except (OSError, ValueError, AttributeError):
            continue
        if made_for == jars or (made_for and not Path(made_for).exists()):
            archive.unlink(missing_ok=True)
            meta_file.unlink(missing_ok=True)
            log.info("jvm archive: removed %s (%s)", archive.name,
                     "superseded" if made_for == jars else f"its jars are gone: {made_for}")
    for aside in kept.parent.glob("spark-*.unusable"):
        aside.unlink(missing_ok=True)
