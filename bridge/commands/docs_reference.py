"""The documentation pages and tables generated from the code.

``python -m bridge.commands.docs_reference`` writes them all;
``python -m bridge.commands.docs_reference --check`` writes nothing and
exits 1 naming every stale one (``tests/docs/test_generated.py`` fails the
same way). Generated, never edited by hand:

* ``docs/reference/configuration.md``: every configuration key with its
  type, default, meaning and environment variable, from the dataclasses of
  ``bridge/config_sections.py`` (the ``#:`` comment above each field is its
  meaning; :data:`MEANINGS` holds those of the fields that have none yet)
  and the checks of ``bridge/config.py``;
* the metrics table of ``docs/metrics.md``: every family ``/metrics``
  serves, with its type, labels and help text, from the collector itself
  (:func:`metric_families`);
* the AMQP peer, mapping and reverse-mapping tables of ``docs/amqp.md``
  and ``docs/amqp-to-mqtt.md``, from ``bridge/peers.py``,
  ``bridge/amqp/mapping.py`` and ``bridge/amqp/reverse.py``;
* ``docs/rules.md`` (the rule table, as ``python -m bridge.mqtt`` prints it);
* ``docs/index.md``: ``README.md`` with its links made relative to ``docs/``
  (the site's home page is the README; edit the README).

A table inside a hand-written page sits between two markers,
``<!-- generated: NAME ... -->`` and ``<!-- end generated: NAME -->``;
only what is between them is replaced.

One piece: every generated page and table, with the one check that they
are current, so that one command writes them all and one test guards them;
:data:`MEANINGS` shrinks as fields get their ``#:`` comments.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import re
import sys
import tempfile
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

__all__ = ["BLOCKS", "MEANINGS", "PAGES", "config_keys", "configuration_page", "main", "metric_families",
           "metrics_table", "render", "site_index", "stale"]

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python -m bridge.commands.docs_reference"

# ---------------------------------------------------------------- configuration

#: Meanings of the keys whose field in ``bridge/config_sections.py`` (or
#: ``bridge.config.Config``) has no ``#:`` comment yet. A key gets its
#: meaning from its ``#:`` comment when it has one; a test fails when an
#: entry here shadows one (move it into the comment, then delete it here).
MEANINGS: dict[str, str] = {
    "log_level": "Level of lakegate's own log lines (stderr): DEBUG also shows the third-party libraries' "
                 "INFO lines and tracebacks of one-line failures.",
    "edge.host": "Address the MQTT listeners bind (`edge.port` and `edge.tls_port`). Beyond loopback, "
                 "`edge.allow_anonymous` or `edge.password_file` must be set [LG-edge-anonymous-beyond-loopback].",
    "edge.port": "MQTT listener port (plain TCP); 0 picks a free port, which the start-up line names.",
    "edge.tls_cert_file": "PEM certificate chain of the TLS listener (`edge.tls_port`).",
    "edge.tls_key_file": "PEM private key of the TLS listener (`edge.tls_port`).",
    "edge.max_connections": "Open MQTT connections at most; beyond: CONNACK 0x89 (3.x 0x03) [LG-edge-busy].",
    "edge.connect_timeout_s": "Seconds a new connection has to complete its CONNECT; else it is closed without "
                              "a CONNACK [LG-edge-connect-timeout].",
    "edge.retain_available": "false: MQTT 5 CONNACKs say Retain Available 0 and a PUBLISH with RETAIN 1 is a "
                             "protocol error (DISCONNECT 0x9A).",
    "capture.partitions": "Partitions of the capture log, fixed when the log is created (a log opened with "
                          "another count is refused); all frames of one connection go to one partition.",
    "capture.segment_bytes": "Size at which a partition's segment file is closed and a new one started.",
    "capture.retention_bytes": "Size budget of the whole log: beyond it, the oldest segments below every "
                               "consumer's committed offset are deleted.",
    "amqp.url": "The AMQP 1.0 peer (`amqp://` or `amqps://`, user and password optional); empty turns "
                "forwarding off.",
    "amqp.password": "Password for SASL PLAIN with `amqp.username`, when the url carries none.",
    "amqp.tls_ca_file": "CA certificates (PEM) that verify the peer of an `amqps://` url (its name checked too).",
    "amqp.link_idle_s": "A sender link unused this long is detached; the connection closes once no link is left.",
    "amqp.disposition_timeout_s": "Seconds the peer has to settle a message; then it is sent again, as for a "
                                  "refusal.",
    "amqp.max_retries": "Attempts after the first for one message; then the range (or batch) fails with the "
                        "address and the outcome.",
    "amqp.retry_backoff_s": "First pause before sending again (and reconnecting), doubled at each attempt, at "
                            "most 30 s.",
    "amqp.container_id": "AMQP container id of lakegate's connections (the downlink's adds `-downlink`).",
    "amqp.live_max_records": "Live forwarding: capture records one range forwards at most.",
    "tables.compact_interval_s": "How often the job runs the maintenance of `lakegate compact` (expire "
                                 "retained messages, compact, vacuum); 0 turns it off.",
    "tables.vacuum_retention_hours": "Files no longer in the tables are vacuumed once older than this (never "
                                     "less than 1 hour: readers and time travel may still need them).",
    "tap.client_id": "The tap's MQTT client id: the broker keeps its persistent session under it.",
    "tap.username": "User name the tap connects with (empty: none).",
    "tap.password": "Password the tap connects with.",
    "tap.keepalive_s": "MQTT Keep Alive of the tap's connection.",
    "tap.tls_ca_file": "CA certificates (PEM) that verify an `mqtts://` broker.",
    "job.max_records_per_trigger": "Admission control: capture records one micro-batch takes at most "
                                   "(500,000: 100,000 msg/s at the 5 s trigger).",
    "job.query_name": "Name of the streaming query; its checkpoint is `data_dir/checkpoints/<query_name>`.",
    "spark.master": "Spark master of a session lakegate builds (`lakegate run`, `process`, `sql`); "
                    "spark-submit's `--master` wins.",
    "spark.app_name": "Spark application name.",
    "spark.driver_memory": "`spark.driver.memory` of a local session.",
    "spark.shuffle_partitions": "`spark.sql.shuffle.partitions`.",
    "spark.ui_enabled": "Spark's web UI (`spark.ui.enabled`).",
    "spark.log_level": "Level of Spark's own (JVM) log.",
    "metrics.host": "Address `/metrics` and `/healthz` bind.",
}

_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """One configuration key as the reference shows it."""

    key: str  # dotted
    section: str  # "" for a top-level key
    type: type
    default: Any
    comment: str  # the ``#:`` comment, "" when there is none

    @property
    def env(self) -> str:
        return "LAKEGATE_" + self.key.replace(".", "_").upper()

    @property
    def meaning(self) -> str:
        return self.comment or MEANINGS.get(self.key, "")


def _field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment above each field of a dataclass, joined into one line."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    (node,) = ast.parse(source).body
    out: dict[str, str] = {}
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            above, i = [], item.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#:"):
                above.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            out[item.target.id] = " ".join(above)
    return out


def config_keys() -> list[ConfigKey]:
    """Every key of the configuration, top-level keys first, then by section in
    the order of :class:`bridge.config.Config`."""
    from bridge import config as cfgmod

    keys: list[ConfigKey] = []
    top = _field_comments(cfgmod.Config)
    defaults = cfgmod.Config()
    hints = typing.get_type_hints(cfgmod.Config)
    sections = cfgmod._sections()
    for f in dataclasses.fields(cfgmod.Config):
        if f.name in sections or f.name in cfgmod._META:
            continue
        keys.append(ConfigKey(f.name, "", hints[f.name], getattr(defaults, f.name), top.get(f.name, "")))
    for name, cls in sections.items():
        comments = _field_comments(cls)
        inst = cls()
        section_hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            keys.append(ConfigKey(f"{name}.{f.name}", name, section_hints[f.name], getattr(inst, f.name),
                                  comments.get(f.name, "")))
    return keys


def _code(text: str) -> str:
    return f"`{text}`"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def _size(n: int) -> str | None:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return None


def _duration(seconds: float) -> str | None:
    for unit, size in (("days", 86400), ("hours", 3600)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit[:-1] if n == 1 else unit}"
    return None


def _default(k: ConfigKey) -> str:
    from bridge.config import PEER_KEYS
    from bridge.peers import PEERS

    if k.section == "amqp" and k.key.split(".", 1)[1] in PEER_KEYS:
        name = k.key.split(".", 1)[1]
        attr = "refuse" if name == "address_refuse" else name
        per_peer = "; ".join(f"{peer}: {_code(_toml(getattr(p, attr)))}" for peer, p in PEERS.items())
        return f"the peer's ({per_peer})"
    text = _code(_toml(k.default))
    if k.type is int and not isinstance(k.default, bool):
        extra = None
        if k.key.endswith("_bytes"):
            extra = _size(k.default)
        elif k.key.endswith("_s"):
            extra = _duration(k.default)
        if extra:
            text += f" ({extra})"
    return text


def _notes(k: ConfigKey) -> list[str]:
    """What ``bridge/config.py`` checks of a key, in words."""
    from bridge import config as cfgmod

    notes = []
    if k.key in cfgmod._CHOICES:
        notes.append("One of " + ", ".join(_code(c) for c in cfgmod._CHOICES[k.key]) + ".")
    if k.key in cfgmod._POSITIVE:
        notes.append("Must be positive.")
    if k.key in cfgmod._PORTS:
        notes.append("A port, 0-65535.")
    if k.key in cfgmod.PATH_KEYS:
        notes.append("A local path: relative to the configuration file that sets it (to the working directory "
                     "from the environment or `--set`).")
    if cfgmod._SECRET_KEY.search(k.key.rsplit(".", 1)[-1]):
        notes.append("A secret: `lakegate config show` masks it.")
    return notes


def md_text(text: str) -> str:
    """A docstring-style comment as Markdown for a table cell: ````x```` as
    ``x``, and outside code spans the characters Markdown or a table would
    read (``*``, ``<``, ``|``) escaped."""
    text = re.sub(r"``(.+?)``", r"`\1`", text)
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = parts[i].replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;")
    return "`".join(parts)


def configuration_page() -> str:
    """``docs/reference/configuration.md``."""
    from bridge import config as cfgmod

    keys = config_keys()
    out = [
        f"<!-- generated by `{COMMAND}` from bridge/config_sections.py: do not edit -->",
        "",
        "# Configuration keys",
        "",
        "Every key lakegate reads, with its type, its built-in default (the same as `conf/lakegate.toml`), "
        "what it means and the environment variable that sets it. How the file, the environment and "
        "`--set` combine, and how relative paths resolve: [Configuration](../configuration.md).",
        "",
        "Precedence, lowest to highest: built-in defaults < `--config FILE` < `LAKEGATE_<SECTION>_<KEY>` "
        "(`LAKEGATE_<KEY>` for a top-level key) < `--set SECTION.KEY=VALUE`. An unknown key or a value of "
        "the wrong type stops the command with exit code 2 and one line naming the key.",
        "",
        "This page is generated from `bridge/config_sections.py` (each field's `#:` comment is its "
        f"meaning) and the checks in `bridge/config.py` by `{COMMAND}`; a test fails when it is stale.",
        "",
    ]
    docs = {name: inspect.getdoc(cls) or "" for name, cls in cfgmod._sections().items()}
    groups: dict[str, list[ConfigKey]] = {}
    for k in keys:
        groups.setdefault(k.section, []).append(k)
    for section, members in groups.items():
        if section:
            out += [f"## [{section}]", "", md_text(" ".join(docs[section].split())), ""]
        else:
            out += ["## Top-level keys", "",
                    "Keys outside any section. `data_dir` holds the capture log, the Delta tables, the "
                    "checkpoints and the edge's state; `conf/lakegate.toml` sets it to `../data`, the "
                    "project's `data/`. It must be a local path (or a shared file system mounted at the same "
                    "path everywhere): a URL such as `s3://bucket/lake` is refused.", ""]
        out += ["| key, environment variable | type | default | meaning |", "|---|---|---|---|"]
        for k in members:
            meaning = md_text(k.meaning)
            if meaning and not meaning.endswith("."):
                meaning += "."
            meaning = " ".join([meaning, *_notes(k)]).strip()
            out.append(f"| `{k.key}`<br>`{k.env}` | {_TYPES[k.type]} | {_default(k)} | {meaning} |")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------- metrics

#: What each label of a metric family holds, for the metrics table.
LABELS: dict[str, str] = {
    "protocol": "MQTT version: `3.1`, `3.1.1`, `5`",
    "transport": "`tcp`, `tls`, `ws` (WebSockets), `wss` (WebSockets over TLS)",
    "type": "MQTT packet type: `CONNECT` ... `AUTH`",
    "qos": "`1` (PUBACK), `2` (PUBREC)",
    "rule": "a rule id, e.g. `MQTT-3.3.1-4` ([rules](rules.md))",
    "table": "`messages`, `retained`, `quarantine`",
    "partition": "a capture log partition",
    "edge": "a cluster edge's id (`cluster.edge_id`)",
    "direction": "`in` (moved to this edge), `out` (moved away)",
}

#: Sections of the metrics table, by name prefix.
GROUPS = (("lakegate_edge_", "Edge"), ("lakegate_cluster_", "Cluster (cluster.edges > 1)"),
          ("lakegate_capture_", "Capture log"),
          ("lakegate_live_forward_", "Live forwarder"), ("lakegate_job_", "Streaming job"))


def _fake_sources(tmp: Path) -> dict[str, Callable[[], Any]]:
    """Stand-ins for the running parts, each with something in every series,
    so that the collector yields every family it has."""
    from bridge.amqp.live import LiveStats
    from bridge.buckets import ACK_BUCKETS_S, FSYNC_BUCKETS_S, Buckets
    from bridge.mqtt.fixed_header import PacketType

    n = max(t.value for t in PacketType) + 1
    session = SimpleNamespace(level=5, bytes_in=10, packets_in=[1] * n)
    conn = SimpleNamespace(session=session, bytes_out=4, packets_out=[1] * n)
    edge = SimpleNamespace(
        conns=[conn], stats={"connections": 1, "refused": 0},
        closed_totals={"packets_in": [0] * n, "packets_out": [0] * n, "bytes_in": 0, "bytes_out": 0},
        ack_latency={PacketType.PUBACK: Buckets(ACK_BUCKETS_S), PacketType.PUBREC: Buckets(ACK_BUCKETS_S)},
        rejected={"MQTT-3.3.1-4": 1},
        cluster_status=lambda: {"members": {0: {"alive": True, "connections": 1, "lag": 0}},
                                "sessions_elsewhere": 0, "moves_in": 0, "moves_out": 0, "records": 0,
                                "dead_edges": 0})
    log = SimpleNamespace(stats={"appends": 1, "commits": 1, "fsyncs": 1, "bytes": 1}, failed=None,
                          fsync_latency=Buckets(FSYNC_BUCKETS_S))
    links = {"open": 2, "peak": 2, "attaches": 2, "detaches": 0, "evictions": 0, "waiting": 0, "lanes": 1,
             "max_links": 1000, "relay": False}
    live = SimpleNamespace(stats=LiveStats(lag={0: 0}), link_stats=lambda: links)
    job = {"totals": {"batches": 1}, "totals_quarantined_by_rule": {"MQTT-3.3.1-4": 1},
           "end_offsets": {"0": 0}, "time": 1.0}
    return {"edge": lambda: edge, "capture": lambda: log, "job": lambda: job, "live": lambda: live,
            "log_end": lambda: [0]}


def metric_families() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(name as scraped, type, label names, help) of every family ``/metrics``
    can serve, in the collector's order, the batch duration histogram after
    the job's other families."""
    from bridge.metrics.collect import LakegateCollector, Metrics

    with tempfile.TemporaryDirectory() as tmp:
        src = _fake_sources(Path(tmp))
        collector = LakegateCollector(src["edge"], src["capture"], src["job"], Path(tmp), src["log_end"],
                                      src["live"])
        metrics = Metrics(job=True)
        metrics.attach(collector)
        metrics.observe_batch({"duration_ms": 1})
        fams = list(metrics.registry.collect())
    out = []
    for fam in fams:
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        labels = tuple(dict.fromkeys(k for s in fam.samples for k in s.labels if k != "le"))
        out.append((name, fam.type, labels, fam.documentation))
    return out


def metrics_table() -> str:
    """The table of ``docs/metrics.md``: every family, grouped by part."""
    fams = metric_families()
    out: list[str] = []
    for prefix, title in GROUPS:
        rows = [f for f in fams if f[0].startswith(prefix)]
        if not rows:
            continue
        out += [f"### {title}", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        for name, kind, labels, doc in rows:
            if kind == "histogram":
                kind = "histogram (`_bucket`, `_sum`, `_count`)"
            lab = "; ".join(f"`{label}`: {LABELS[label]}" for label in labels)
            out.append(f"| `{name}` | {kind} | {lab} | {md_text(doc)} |")
        out.append("")
    ungrouped = [f[0] for f in fams if not any(f[0].startswith(p) for p, _ in GROUPS)]
    if ungrouped:
        raise ValueError(f"metric families outside GROUPS: {ungrouped}")
    return "\n".join(out).rstrip("\n")


# ---------------------------------------------------------------- the home page

_LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def site_index(readme: str | None = None) -> str:
    """``docs/index.md``: the README with its links made relative to ``docs/``.
    The README may link to pages under ``docs/``, to ``ARCHITECTURE.md``, to
    its own sections and to the web; any other link would be broken on the
    site, and raises."""
    text = (ROOT / "README.md").read_text(encoding="utf-8") if readme is None else readme

    def fix(m: re.Match) -> str:
        target = m.group(2)
        if target.startswith(("http://", "https://", "#", "mailto:")):
            return m.group(0)
        if target.startswith("docs/"):
            return m.group(1) + target[len("docs/"):] + m.group(3)
        if target.split("#", 1)[0] == "ARCHITECTURE.md":
            return m.group(1) + "architecture.md" + target[len("ARCHITECTURE.md"):] + m.group(3)
        raise ValueError(f"README.md links to {target!r}, which the site does not have: link a page under docs/")

    body = _LINK.sub(fix, text)
    return f"<!-- generated by `{COMMAND}` from README.md: edit the README -->\n\n{body}"


# ---------------------------------------------------------------- pages and blocks

def _rules() -> str:
    from bridge.mqtt.rules import render_markdown

    return render_markdown()


def _mapping(profile: str) -> Callable[[], str]:
    def make() -> str:
        from bridge.amqp.mapping import mapping_table_markdown

        return mapping_table_markdown(profile)
    return make


def _peers() -> str:
    from bridge.peers import peer_table_markdown

    return peer_table_markdown()


def _reverse(profile: str) -> Callable[[], str]:
    def make() -> str:
        from bridge.amqp.reverse import reverse_table_markdown

        return reverse_table_markdown(profile)
    return make


#: whole pages: path under the repository -> its text
PAGES: dict[str, Callable[[], str]] = {
    "docs/reference/configuration.md": configuration_page,
    "docs/rules.md": _rules,
    "docs/index.md": site_index,
}

#: (page, block name) -> the block's text, between the page's markers
BLOCKS: dict[tuple[str, str], Callable[[], str]] = {
    ("docs/metrics.md", "metrics"): metrics_table,
    ("docs/amqp.md", "peers"): _peers,
    ("docs/amqp.md", "mapping-seed"): _mapping("seed"),
    ("docs/amqp.md", "mapping-enmasse"): _mapping("enmasse"),
    ("docs/amqp-to-mqtt.md", "reverse-seed"): _reverse("seed"),
}


def _block_re(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- generated: {re.escape(name)} [^\n]*-->\n)(.*?)(<!-- end generated: "
                      rf"{re.escape(name)} -->)", re.S)


def render(root: Path = ROOT) -> dict[Path, str]:
    """The text every generated file should have now."""
    out: dict[Path, str] = {}
    for rel, make in PAGES.items():
        out[root / rel] = make()
    for (rel, name), make in BLOCKS.items():
        path = root / rel
        text = out.get(path) or path.read_text(encoding="utf-8")
        pattern = _block_re(name)
        if not pattern.search(text):
            raise ValueError(f"{rel} has no block {name!r}: put <!-- generated: {name} ({COMMAND}) --> and "
                             f"<!-- end generated: {name} --> where the table goes")
        out[path] = pattern.sub(lambda m: m.group(1) + "\n" + make() + "\n\n" + m.group(3), text, count=1)
    return out


def stale(root: Path = ROOT) -> list[Path]:
    """Generated files whose text is not what the code generates now."""
    return [p for p, text in render(root).items() if not p.exists() or p.read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for p in old:
            print(f"stale: {p.relative_to(ROOT)} (run {COMMAND})")
        return 1 if old else 0
    for path, text in render().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
