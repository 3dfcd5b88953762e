"""lakegate configuration: one typed object, loaded once.

Precedence, lowest to highest: built-in defaults (identical to
``conf/lakegate.toml``) < the ``--config`` file < environment variables
``LAKEGATE_<SECTION>_<KEY>`` (``LAKEGATE_<KEY>`` for top-level keys) <
``--set KEY=VALUE`` with dotted keys.

Unknown keys and values of the wrong type raise :class:`ConfigError`, whose
message names the key and where the value came from; the CLI turns it into
one line on stderr and exit code 2.

Relative paths (``data_dir`` and the ``*_file`` keys) are relative to the
configuration file that set them; set in the environment or with ``--set``,
to the working directory. The built-in defaults are ``conf/lakegate.toml``
and resolve as that file does: ``data_dir = "../data"`` is the project's
``data/`` whatever the working directory (a notebook's kernel runs in
``notebooks/``). A URL (``s3://...``) where a local path is needed is
refused until object storage is supported.

Units are in the key names (``keepalive_s``, ``max_packet_bytes``). The key
names ``data_dir``, ``edge.host``, ``edge.port``, ``amqp.url``,
``amqp.address_template`` and ``amqp.profile`` are a public contract.

This module loads and checks; the configuration written out again (as TOML
for ``lakegate config``, as JSON over a pipe to a child process, and back)
is :mod:`bridge.config_render`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

from bridge.config_sections import (AmqpConfig, CaptureConfig, ClusterConfig, EdgeConfig, JobConfig, KafkaConfig,
                                    MetricsConfig, SparkConfig, SqlConfig, TablesConfig, TapConfig)
from bridge.peers import PEERS

__all__ = [
    "AmqpConfig",
    "CaptureConfig",
    "Config",
    "ConfigError",
    "EdgeConfig",
    "JobConfig",
    "KafkaConfig",
    "TapConfig",
    "SparkConfig",
    "SqlConfig",
    "MetricsConfig",
    "ClusterConfig",
    "TablesConfig",
    "conf_dir",
    "load_config",
    "mask_secret",
    "set_value",
]

ENV_PREFIX = "LAKEGATE_"
#: Keys that name a file or directory on the local file system.
PATH_KEYS = frozenset({"data_dir", "edge.tls_cert_file", "edge.tls_key_file", "edge.password_file",
                       "edge.acl_file", "amqp.tls_ca_file", "tap.tls_ca_file", "edge.tls_client_ca_file", "edge.tls_crl_file",
                       "kafka.ssl_ca_location", "kafka.ssl_certificate_location", "kafka.ssl_key_location"})
#: Bookkeeping fields of Config that are not configuration keys.
_META = ("sources", "bases")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def conf_dir() -> Path | None:
    """The project's conf/ directory ($LAKEGATE_CONF_DIR, else beside the package)."""
    env = os.environ.get("LAKEGATE_CONF_DIR")
    cand = Path(env) if env else Path(__file__).resolve().parents[1] / "conf"
    return cand if cand.is_dir() else None


def defaults_dir() -> Path:
    """Where the built-in defaults' relative paths resolve: the directory of
    ``conf/lakegate.toml`` (without a project checkout: ``./conf``, so that
    ``../data`` is ``./data``)."""
    return conf_dir() or Path.cwd() / "conf"


class ConfigError(ValueError):
    """A configuration value is unknown or ill-typed.

    ``key`` is the dotted key, ``source`` says where the value came from
    (a file path, ``environment LAKEGATE_X`` or ``--set``).
    """

    def __init__(self, key: str, source: str, problem: str) -> None:
        self.key = key
        self.source = source
        self.problem = problem
        super().__init__(f"config error: {key}: {problem} (from {source})")



@dataclass
class Config:
    """The effective lakegate configuration."""

    #: relative to conf/ (see the module doc): the project's data/
    data_dir: str = "../data"
    log_level: str = "INFO"
    edge: EdgeConfig = field(default_factory=EdgeConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    amqp: AmqpConfig = field(default_factory=AmqpConfig)
    tables: TablesConfig = field(default_factory=TablesConfig)
    tap: TapConfig = field(default_factory=TapConfig)
    job: JobConfig = field(default_factory=JobConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    sql: SqlConfig = field(default_factory=SqlConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    #: dotted key -> where its value came from ("default" when not listed).
    sources: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    #: path key -> the directory its relative value is relative to (the
    #: file's directory, or the working directory for environment and
    #: --set); not listed: the built-in defaults' (``defaults_dir()``).
    bases: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    # ---- derived paths (all under data_dir) ----
    @property
    def data_path(self) -> Path:
        base = self.bases.get("data_dir")
        return (Path(base) if base else defaults_dir()).joinpath(Path(self.data_dir).expanduser()).resolve()

    @property
    def capture_stream(self) -> str:
        """The capture log's name as its records and marks carry it: on Kafka
        the topic (Spark's Kafka source gives it as ``topic``), else
        ``capture.stream``."""
        return self.kafka_topic if self.capture.backend == "kafka" else self.capture.stream

    @property
    def kafka_topic(self) -> str:
        """The capture log's Kafka topic (``capture.backend = "kafka"``):
        ``kafka.topic``, else ``capture.stream``."""
        return self.kafka.topic or self.capture.stream

    @property
    def capture_dir(self) -> Path:
        return self.data_path / "capture"

    @property
    def tables_dir(self) -> Path:
        return self.data_path / "tables"

    @property
    def checkpoint_dir(self) -> Path:
        return self.data_path / "checkpoints"

    @property
    def edge_state_dir(self) -> Path:
        return self.data_path / "edge"

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name in _META:
            d.pop(name, None)
        return d

    def to_json(self, masked: bool = True) -> str:
        d = self.as_dict()
        if masked:
            _mask_tree(d)
        return json.dumps(d, indent=2, sort_keys=False)


_CHOICES: dict[str, tuple[str, ...]] = {
    "capture.backend": ("local", "kafka"),
    "kafka.compression": ("none", "gzip", "snappy", "lz4", "zstd"),
    "kafka.security_protocol": ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"),
    "amqp.profile": ("seed", "enmasse"),
    "amqp.peer": ("rabbitmq", "artemis", "generic"),
    "amqp.qos2_rcv_settle_mode": ("profile", "first", "second"),
    "amqp.downlink_pubrel": ("peer", "edge"),
    "amqp.forward_by": ("auto", "edge", "job"),
    "amqp.anonymous_relay": ("auto", "on", "off"),
    "edge.ack_after": ("capture", "forward"), "edge.cert_identity": ("none", "cn", "subject", "san"),
    "tables.engine": ("auto", "delta-rs", "delta-spark"),
    "log_level": ("DEBUG", "INFO", "WARNING", "ERROR"),
    "spark.log_level": ("ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"),
}
_POSITIVE = {
    "capture.partitions",
    "capture.segment_bytes",
    "capture.fsync_records",
    "capture.max_pending_bytes",
    "capture.retention_check_interval_s",
    "edge.max_connections",
    "edge.max_packet_bytes",
    "edge.receive_maximum",
    "edge.max_inflight_qos2",
    "edge.auth_workers",
    "edge.auth_max_pending",
    "edge.auth_max_pending_per_address",
    "edge.frame_timeout_s",
    "edge.max_buffered_bytes",
    "edge.max_persistent_sessions",
    "edge.max_stored_qos2_ids",
    "edge.max_inflight_messages",
    "edge.max_queued_messages",
    "edge.max_queued_bytes",
    "edge.max_subscriptions_per_client",
    "edge.max_topic_levels",
    "edge.max_topic_length",
    "edge.retained_cache_bytes",
    "edge.retained_refresh_s",
    "job.max_records_per_trigger",
    "metrics.max_batch_age_s",
    "amqp.downlink_credit",
    "amqp.live_interval_ms",
    "amqp.live_max_records",
    "spark.shuffle_partitions",
    "cluster.edges", "cluster.lease_s",
}
_PORTS = {"edge.port", "edge.tls_port", "edge.ws_port", "edge.wss_port", "sql.connect_port", "metrics.port"}
_SECRET_KEY = re.compile(r"(password|secret|token)", re.I)


def _sections() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config) if dataclasses.is_dataclass(hints[f.name])}


def _top_level() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(Config)
        if f.name not in _META and not dataclasses.is_dataclass(hints[f.name])
    }


def _fields(section_cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(section_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_cls)}


def known_keys() -> dict[str, type]:
    """Every dotted key with its Python type."""
    keys = dict(_top_level())
    for name, cls in _sections().items():
        for k, t in _fields(cls).items():
            keys[f"{name}.{k}"] = t
    return keys


_TYPE_WORD = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _coerce(key: str, typ: type, value: Any, source: str, from_text: bool) -> Any:
    """Check (TOML values) or parse (environment and --set text) one value."""
    if from_text:
        text = str(value).strip()
        try:
            if typ is bool:
                low = text.lower()
                if low in ("true", "1", "yes", "on"):
                    return True
                if low in ("false", "0", "no", "off"):
                    return False
                raise ValueError
            if typ is int:
                return int(text, 0) if text.lower().startswith(("0x", "0o", "0b")) else int(text)
            if typ is float:
                return float(text)
            return str(value)
        except ValueError:
            raise ConfigError(key, source, f"expected {_TYPE_WORD[typ]}, got {text!r}") from None
    ok = (
        (typ is bool and isinstance(value, bool))
        or (typ is int and isinstance(value, int) and not isinstance(value, bool))
        or (typ is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (typ is str and isinstance(value, str))
    )
    if not ok:
        raise ConfigError(key, source, f"expected {_TYPE_WORD[typ]}, got {type(value).__name__} {value!r}")
    return float(value) if typ is float else value


def _validate(key: str, value: Any, source: str) -> None:
    if key in PATH_KEYS and _URL.match(value):
        raise ConfigError(key, source, f"{value.split('://', 1)[0]}:// is a URL; object storage is not supported "
                          "yet: give a local path (or a shared file system mounted at the same path everywhere)")
    if key in _CHOICES and value not in _CHOICES[key]:
        raise ConfigError(key, source, f"must be one of {', '.join(_CHOICES[key])}, got {value!r}")
    if key in _POSITIVE and value <= 0:
        raise ConfigError(key, source, f"must be positive, got {value!r}")
    if key in _PORTS and not (0 <= value <= 65535):
        raise ConfigError(key, source, f"must be a TCP port (0-65535), got {value!r}")
    if key == "edge.receive_maximum" and value > 65535:
        raise ConfigError(key, source, f"must be at most 65535, got {value!r}")
    if key == "edge.topic_alias_maximum" and not (0 <= value <= 65535):
        raise ConfigError(key, source, f"must be 0-65535, got {value!r}")
    if key in ("edge.persistent_session_expiry_s", "edge.auth_failure_backoff_s",
               "job.forward_on_driver_max_rows", "job.parse_on_driver_max_rows") and value < 0:
        raise ConfigError(key, source, f"must be 0 or more, got {value!r}")
    if key == "cluster.edge_id" and not (0 <= value <= 255):
        raise ConfigError(key, source, f"must be 0-255, got {value!r}")
    if key == "cluster.edges" and value > 256:
        raise ConfigError(key, source, f"must be at most 256, got {value!r}")
    if key == "job.run_nice" and not (0 <= value <= 19):
        raise ConfigError(key, source, f"must be 0-19 (a niceness the run adds to its own work), got {value!r}")
    if key == "edge.max_topic_length" and value > 65535:
        raise ConfigError(key, source, f"must be at most 65535 (MQTT's limit), got {value!r}")
    if key == "edge.max_packet_bytes" and value > 268435460:
        raise ConfigError(key, source, f"must be at most 268435460 (MQTT's limit), got {value!r}")
    if key == "amqp.max_links" and value < 2:
        raise ConfigError(key, source, f"must be 2 or more (an address's QoS 0/1 and QoS 2 links must fit together), "
                          f"got {value!r}; there is no unbounded setting: a link per topic is what made the peer "
                          "stop answering attaches (issue 39)")
    if key == "amqp.address_template" and "{topic}" not in value and "{routing_key}" not in value:
        raise ConfigError(key, source, "must contain {topic} or {routing_key}")
    if key == "tap.broker" and value:
        parts = urlsplit(value)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ConfigError(key, source, "must be mqtt://host[:port] or mqtts://host[:port]")
    if key == "spark.java_options":
        try:
            opts = shlex.split(value)
        except ValueError as exc:
            raise ConfigError(key, source, f"cannot be split into options like a shell would: {exc}") from None
        bad = [o for o in opts if not o.startswith("-")]
        if bad:
            raise ConfigError(key, source, f"JVM options start with '-'; got {bad[0]!r}")
    if key == "amqp.url" and value:
        parts = urlsplit(value)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise ConfigError(key, source, "must be amqp://[user:pass@]host[:port] or amqps://..., or empty to turn forwarding off")


def _set(cfg: Config, key: str, value: Any, source: str, from_text: bool, base: Path | None = None) -> None:
    """``base``: the directory a relative path is relative to (default: the working directory)."""
    keys = known_keys()
    if key not in keys:
        section = key.split(".", 1)[0]
        hint = ""
        if section in _sections():
            hint = f"; known keys in [{section}]: {', '.join(sorted(_fields(_sections()[section])))}"
        raise ConfigError(key, source, f"unknown key{hint}")
    value = _coerce(key, keys[key], value, source, from_text)
    _validate(key, value, source)
    if key in PATH_KEYS:
        base = (base or Path.cwd()).resolve()
        if key == "data_dir":
            cfg.bases[key] = str(base)  # data_dir stays as written; data_path resolves it
        elif value and not Path(value).expanduser().is_absolute():
            value = str(base / Path(value).expanduser())  # the edge, the tap and executors open these as given
    if "." in key:
        section, name = key.split(".", 1)
        setattr(getattr(cfg, section), name, value)
    else:
        setattr(cfg, key, value)
    cfg.sources[key] = source


def set_value(cfg: Config, key: str, text: str, source: str) -> None:
    """Set one key from text (as ``--set`` does), with the same checks; raises ConfigError."""
    _set(cfg, key, text, source, from_text=True)


def _flatten(tree: Mapping[str, Any], source: str, prefix: str = "") -> Iterable[tuple[str, Any]]:
    sections = _sections()
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            if prefix or k not in sections:
                raise ConfigError(key, source, "unknown section" if not prefix else "unexpected table")
            yield from _flatten(v, source, prefix=f"{key}.")
        else:
            yield key, v


def _env_items(env: Mapping[str, str]) -> Iterable[tuple[str, str, str]]:
    """(dotted key, text, source) for LAKEGATE_* variables that name config keys.

    A variable whose name starts with a known section (``LAKEGATE_EDGE_...``)
    must name a known key; other ``LAKEGATE_*`` variables that match a top-level
    key are used, and the rest (e.g. ``LAKEGATE_SERVICES_DIR``, used by
    scripts) are not configuration and are ignored.
    """
    sections = _sections()
    top = _top_level()
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        source = f"environment {name}"
        if rest in top:
            yield rest, env[name], source
            continue
        for sec in sections:
            if rest.startswith(sec + "_"):
                yield f"{sec}.{rest[len(sec) + 1:]}", env[name], source
                break


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
) -> Config:
    """Load the effective configuration.

    ``path``: a TOML file (None: built-in defaults only). ``overrides``:
    ``KEY=VALUE`` strings from ``--set``. ``env``: the environment (default
    ``os.environ``). Raises :class:`ConfigError`.
    """
    cfg = Config()
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            with p.open("rb") as fh:
                tree = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError("--config", source, "file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("--config", source, f"not valid TOML: {exc}") from None
        for key, value in _flatten(tree, source):
            _set(cfg, key, value, source, from_text=False, base=p.resolve().parent)
    for key, text, source in _env_items(os.environ if env is None else env):
        _set(cfg, key, text, source, from_text=True)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(item, "--set", "expected KEY=VALUE")
        key, text = item.split("=", 1)
        _set(cfg, key.strip(), text, f"--set {key.strip()}", from_text=True)
    _peer_defaults(cfg)
    _check_together(cfg)
    return cfg


#: keys whose default is the AMQP peer's (``amqp.peer``, :mod:`bridge.peers`)
PEER_KEYS = ("address_template", "client_address_template", "downlink_topic_address", "address_refuse",
             "property_refuse")


def _peer_defaults(cfg: Config) -> None:
    """Give each of :data:`PEER_KEYS` the peer's value unless it was set."""
    peer = PEERS[cfg.amqp.peer]
    for name in PEER_KEYS:
        key = f"amqp.{name}"
        if key not in cfg.sources:
            setattr(cfg.amqp, name, getattr(peer, "refuse" if name == "address_refuse" else name))


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _check_together(cfg: Config) -> None:
    """Rules over more than one key."""
    amqp = cfg.amqp
    if amqp.downlink and amqp.downlink_topic_address in PEERS[amqp.peer].looping_topic_links:
        raise ConfigError("amqp.downlink_topic_address", cfg.sources.get("amqp.downlink_topic_address", "default"),
                          f"{amqp.downlink_topic_address!r} on amqp.peer = {amqp.peer!r} receives every address of "
                          "the broker, its dead-letter address too: each message the edge rejects would come back "
                          "from there for ever [LG-amqp-topic-link-loop]; name the addresses of your commands, "
                          "e.g. topic://cmd.#")
    sql = cfg.sql
    if sql.connect_port and sql.connect_host not in _LOOPBACK and not sql.connect_token \
            and not sql.connect_host.startswith("127."):
        raise ConfigError("sql.connect_host", cfg.sources.get("sql.connect_host", "default"),
                          f"{sql.connect_host!r} is not a loopback address: set sql.connect_token too (any client "
                          "that reaches the port could read every table), or bind 127.0.0.1")
    bad = cfg.cluster.problem(cfg.capture)
    if bad is not None:
        raise ConfigError(bad[0], cfg.sources.get(bad[0], "default"), bad[1])


def mask_secret(key: str, value: Any) -> Any:
    """The value as it may be shown or logged: passwords and URL credentials masked."""
    if isinstance(value, str) and value:
        if _SECRET_KEY.search(key.rsplit(".", 1)[-1]):
            return "****"
        if "://" in value and "@" in value:
            parts = urlsplit(value)
            if parts.password is not None:
                netloc = f"{parts.username}:****@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
                return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return value


def _mask_tree(d: dict[str, Any], prefix: str = "") -> None:
    for k, v in d.items():
        if isinstance(v, dict):
            _mask_tree(v, f"{prefix}{k}.")
        else:
            d[k] = mask_secret(f"{prefix}{k}", v)
