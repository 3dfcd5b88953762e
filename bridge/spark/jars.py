"""The JVM jars lakegate puts on Spark's classpath, and where they come from.

``jvm/pom.xml`` pins them (one Maven profile per group); ``scripts/bootstrap``
resolves them with Maven (checksums checked, ``--strict-checksums``) into
``.jvm/lib/<group>/`` (git-ignored) and then calls :func:`prune`, which takes
out every jar whose artifact Spark ships already (pyspark's ``jars/``:
Hadoop, Jackson, Parquet, log4j, Scala ...): Spark's own copy is the one its
classes were built against, and a second version on the classpath is a
conflict waiting to happen. What is left is what the group adds.

* ``delta`` (:data:`GROUPS`): delta-spark and delta-storage (and what they
  need that Spark lacks): ``tables.engine = "delta-spark"``, SQL on Delta
  tables (``DESCRIBE HISTORY``, ``VERSION AS OF``, ``OPTIMIZE``).
* ``kafka``: Spark's Kafka source and sink with kafka-clients.

A local session (:func:`bridge.spark.session.build_session`) gets them
through :func:`spark_conf` (``spark.jars``, local files: nothing is fetched
at run time, no Ivy), and with delta its SQL extension and catalog;
``spark-submit`` through ``conf/spark-defaults.conf`` (``spark.jars``
with the ``.jvm/lib`` globs, relative to the checkout: spark-submit expands
them, adds the jars to the driver's class loader and serves them to the
executors) or
``--jars`` (:func:`submit_options`; ``lakegate doctor`` prints the line).
:func:`problems` says, one line per group, what is missing or of the wrong
Spark or Scala version, and the command that fetches it;
:func:`listed_problems` the same of the jars spark-submit was given.
:class:`JarsUnusable` is such a line where it stops a command: a jar of
another Spark or Scala line on the classpath, or ``tables.engine =
"delta-spark"`` without delta-spark (a configuration error: exit 2).

No pyspark import here: the bootstrap runs :func:`prune` before any JVM.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from bridge.config import ConfigError

__all__ = ["GROUPS", "Group", "JarsUnusable", "jar_line", "jars", "jvm_dir", "listed_problems", "problems", "prune",
           "spark_conf", "spark_jars_dir", "submit_options", "summary"]

log = logging.getLogger(__name__)

#: what fetches the jars (and the rest of the project's JVM artifacts)
FETCH = "scripts/bootstrap (Maven, jvm/pom.xml)"


@dataclass(frozen=True)
class Group:
    """One folder of jars: its Maven profile, the artifact that must be there
    (a file name prefix: ``<artifactId>-<version>.jar``), what it is for."""

    name: str
    profile: str
    artifact: str
    purpose: str


GROUPS: dict[str, Group] = {
    "delta": Group("delta", "spark-delta", "delta-spark_", "delta-spark: tables.engine = \"delta-spark\", SQL on "
                                                          "Delta tables (DESCRIBE HISTORY, VERSION AS OF, OPTIMIZE)"),
    "kafka": Group("kafka", "spark-kafka", "spark-sql-kafka-0-10_", "Spark's Kafka source and sink"),
}

#: Spark SQL settings that make delta-spark the session's Delta (with its jars present)
DELTA_SQL_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

_ROOT = Path(__file__).resolve().parents[2]
#: ``<artifactId>-<version>.jar``: the version starts at the first ``-<digit>``
_JAR = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d[^/]*)\.jar$")
#: the same, for the eye: the version starts at the last ``-<digit>`` (spark-sql-kafka-0-10_2.13 4.2.0)
_VERSIONED = re.compile(r"^(.+)-(\d[^/]*)\.jar$")
#: the Spark and Scala line in a group's main jar name, wherever it lies (Ivy's
#: copies are ``io.delta_delta-spark_4.2_2.13-4.4.0.jar``): delta-spark_<spark>_<scala>-<delta>,
#: spark-sql-kafka-0-10_<scala>-<spark>
_LINES = {
    "delta": re.compile(r"delta-spark_(?P<spark>\d+\.\d+)_(?P<scala>\d+\.\d+)-\d"),
    "kafka": re.compile(r"spark-sql-kafka-0-10_(?P<scala>\d+\.\d+)-(?P<spark>\d+\.\d+)\."),
}


class JarsUnusable(ConfigError):
    """A jar group stops a command: one line naming the artifact and the
    command that fetches it (a configuration error: exit 2)."""

    def __init__(self, key: str, source: str, line: str) -> None:
        self.key, self.source, self.problem = key, source, line
        ValueError.__init__(self, line)


def jvm_dir() -> Path:
    """``$LAKEGATE_JVM_DIR``, else the checkout's ``.jvm/``."""
    return Path(os.environ.get("LAKEGATE_JVM_DIR") or _ROOT / ".jvm")


def jars(group: str) -> list[Path]:
    """The jars of ``group`` (``.jvm/lib/<group>/*.jar``), sorted; [] when absent."""
    folder = jvm_dir() / "lib" / group
    return sorted(folder.glob("*.jar")) if folder.is_dir() else []


def spark_jars_dir() -> Path | None:
    """pyspark's own ``jars/`` folder (found without importing pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "jars"
    return folder if folder.is_dir() else None


def _artifact(path: Path) -> str | None:
    m = _JAR.match(path.name)
    return m.group("artifact") if m else None


def _spark_line() -> tuple[str, str] | None:
    """(Spark major.minor, Scala binary version) of the Spark pyspark ships,
    read from its jar names (``spark-core_2.13-4.2.0.jar``)."""
    folder = spark_jars_dir()
    if folder is None:
        return None
    for path in folder.glob("spark-core_*.jar"):
        m = re.match(r"^spark-core_(\d+\.\d+)-(\d+\.\d+)\.", path.name)
        if m:
            return m.group(2), m.group(1)
    return None


def prune(folder: Path, spark_jars: Path | None = None) -> list[str]:
    """Delete from ``folder`` every jar whose artifact Spark ships in
    ``spark_jars`` (default: pyspark's), whatever its version; the names deleted."""
    spark_jars = spark_jars or spark_jars_dir()
    if spark_jars is None:
        return []
    shipped = {a for a in map(_artifact, spark_jars.glob("*.jar")) if a}
    gone = []
    for path in sorted(folder.glob("*.jar")):
        if _artifact(path) in shipped:
            path.unlink()
            gone.append(path.name)
    return gone


def jar_line(name: str) -> tuple[str, str, str] | None:
    """(group, Spark major.minor, Scala binary version) a group's main jar is
    built for, from its file name; None for any other jar."""
    for group, pattern in _LINES.items():
        m = pattern.search(Path(name).name)
        if m:
            return group, m.group("spark"), m.group("scala")
    return None


def _mismatch(path: str, where: str, spark: str, scala: str, runtime: str) -> str | None:
    line = jar_line(path)
    if line is None or (line[1], line[2]) == (spark, scala):
        return None
    return (f"{Path(path).name} {where} is for Spark {line[1]} / Scala {line[2]}, but {runtime} is "
            f"Spark {spark} / Scala {scala}: run {FETCH} for the version pinned for it")


def problems(group: str, purpose: bool = True) -> list[str]:
    """What stops ``group`` from working with this pyspark, one line each
    (naming the artifact and the command that fetches it; ``purpose``: and
    what the group is for); [] when none."""
    g = GROUPS[group]
    found = [p for p in jars(group) if p.name.startswith(g.artifact)]
    where = jvm_dir() / "lib" / group
    if not found:
        why = f" (for {g.purpose})" if purpose else ""
        return [f"{g.artifact.rstrip('_')} jar missing in {where}/{why}: run {FETCH}"]
    line = _spark_line()
    if line is None:
        return []
    return [bad for p in found if (bad := _mismatch(str(p), f"in {where}/", *line, "pyspark")) is not None]


def listed_problems(paths: list[str], spark_version: str, scala_version: str) -> list[str]:
    """The jars among ``paths`` (spark-submit's ``spark.jars``: files or
    URLs) built for another Spark or Scala line than the running one
    (``spark_version`` 4.2.0, ``scala_version`` 2.13.16), one line each."""
    spark = ".".join(spark_version.split(".")[:2])
    scala = ".".join(scala_version.split(".")[:2])
    return [bad for p in paths if p and (bad := _mismatch(p.rsplit("/", 1)[-1], "(spark.jars)", spark, scala,
                                                          "this spark-submit")) is not None]


def summary(group: str) -> str:
    """``11 jars: delta-spark_4.2_2.13 4.4.0, delta-storage 4.4.0, ...`` (doctor)."""
    found = jars(group)
    named = []
    for p in found:
        m = _VERSIONED.match(p.name)
        named.append(f"{m.group(1)} {m.group(2)}" if m else p.name)
    return f"{len(found)} jar{'s' if len(found) != 1 else ''}: {', '.join(named)}"


def submit_options(groups: tuple[str, ...] = tuple(GROUPS)) -> list[str]:
    """spark-submit's options for the jars: ``--properties-file
    conf/spark-defaults.conf`` (its ``spark.jars`` globs are relative to the
    checkout, where the command runs), plus ``--jars`` with absolute globs
    when the jars live elsewhere (``$LAKEGATE_JVM_DIR``): ``--jars`` wins
    over the file's ``spark.jars``."""
    opts = ["--properties-file", "conf/spark-defaults.conf"]
    if jvm_dir().resolve() != (_ROOT / ".jvm").resolve():
        opts += ["--jars", ",".join(str(jvm_dir() / "lib" / g / "*.jar") for g in groups)]
    return opts


_SAID: set[str] = set()


def spark_conf(groups: tuple[str, ...] = ("delta", "kafka"), engine: str = "auto") -> dict[str, str]:
    """Spark settings that put the present, usable groups' jars on a local
    session's classpath (``spark.jars``: local files), with delta-spark's
    SQL extension and catalog when its jars are there. A group missing or
    unusable is said once per process (INFO), and left out. ``engine``:
    ``tables.engine`` (the line says delta-rs takes over unless delta-spark
    was asked for)."""
    paths: list[str] = []
    conf: dict[str, str] = {}
    for group in groups:
        bad = problems(group)
        if bad:
            if group not in _SAID:
                _SAID.add(group)
                extra = "; tables go through delta-rs" if group == "delta" and engine != "delta-spark" else ""
                log.info("spark: %s%s", bad[0], extra)
            continue
        paths += [str(p) for p in jars(group)]
        if group == "delta":
            conf.update(DELTA_SQL_CONF)
    if paths:
        conf["spark.jars"] = ",".join(paths)
    return conf


def _main(argv: list[str]) -> int:
    """``python -m bridge.spark.jars prune <folder>`` (scripts/bootstrap)."""
    if len(argv) == 2 and argv[0] == "prune":
        gone = prune(Path(argv[1]))
        left = len(list(Path(argv[1]).glob("*.jar")))
        print(f"bootstrap: {argv[1]}: {left} jars; {len(gone)} left out, Spark ships them")
        return 0
    print("usage: python -m bridge.spark.jars prune <folder>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
