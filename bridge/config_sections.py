"""The configuration's sections, one dataclass each: every key with its
default (identical to ``conf/lakegate.toml``) and what it means.
:class:`bridge.config.Config` holds one of each; ``bridge.config`` loads,
checks and renders them (and re-exports these classes)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EdgeConfig", "CaptureConfig", "AmqpConfig", "TablesConfig", "TapConfig", "JobConfig", "SparkConfig", "SqlConfig", "MetricsConfig"]


@dataclass
class EdgeConfig:
    """The MQTT edge server (``lakegate edge``)."""

    host: str = "127.0.0.1"
    port: int = 1883
    #: TLS listener port; 0 = no TLS listener.
    tls_port: int = 0
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: PEM CA bundle that client certificates of the TLS listeners
    #: (edge.tls_port, edge.wss_port) are verified against; empty = none asked for.
    tls_client_ca_file: str = ""
    #: With edge.tls_client_ca_file: a TLS client without a valid
    #: certificate fails the handshake (false: one without any goes on to
    #: the password and anonymous rules; an invalid one still fails).
    require_certificate: bool = False
    #: PEM certificate revocation list checked for each client certificate; empty = none.
    tls_crl_file: str = ""
    #: What of a TLS client's verified certificate is its user name (for
    #: the ACL and the capture records; its CONNECT's user name and password
    #: are then not used): "none", "cn" (the subject's CN, Mosquitto's
    #: use_identity_as_username), "subject" (RFC 2253, Mosquitto's
    #: use_subject_as_username) or "san" (the first DNS, email or URI
    #: subject alternative name). A TLS client without one: CONNACK 0x87.
    cert_identity: str = "none"
    #: MQTT over WebSockets (MQTT 5.0 section 6) listener port; 0 = none.
    ws_port: int = 0
    #: MQTT over secure WebSockets (TLS with edge.tls_cert_file) listener port; 0 = none.
    wss_port: int = 0
    #: The HTTP path WebSocket clients open; other paths get 404.
    ws_path: str = "/mqtt"
    #: Origins a WebSocket handshake may come from (its Origin header),
    #: comma-separated; empty = any (clients that are not browsers send none).
    ws_origins: str = ""
    #: Addresses of reverse proxies in front of the WebSocket listeners,
    #: comma-separated: for a connection from one of them the client's
    #: address is the last X-Forwarded-For entry (logs, capture records,
    #: per-address limits); empty = the TCP peer is the client.
    ws_trusted_proxies: str = ""
    max_connections: int = 10000
    #: Maximum Packet Size the edge accepts (and advertises in MQTT 5 CONNACK).
    max_packet_bytes: int = 1048576
    #: Receive Maximum advertised in MQTT 5 CONNACK.
    receive_maximum: int = 1024
    #: Topic Alias Maximum advertised in MQTT 5 CONNACK (0 = no aliases).
    topic_alias_maximum: int = 64
    #: Unacknowledged QoS 2 packet ids allowed per client (awaiting PUBREL).
    max_inflight_qos2: int = 1024
    connect_timeout_s: float = 10.0
    retain_available: bool = True
    #: Clients without a user name may connect. The default (true) holds while
    #: every listener binds loopback (edge.host 127.0.0.0/8, ::1, localhost).
    #: Beyond loopback (another address, or "", "0.0.0.0", "::": all
    #: interfaces; edge.port, edge.tls_port alike) it must be set by the user,
    #: as in Mosquitto 2.0: true lets anyone who reaches the port publish and
    #: subscribe; not set, anonymous clients are refused (CONNACK 0x87, 3.x
    #: 0x05) when edge.password_file is set, else the edge does not start
    #: (one line, exit code 2) [LG-edge-anonymous-beyond-loopback].
    allow_anonymous: bool = True
    #: Password file managed by ``lakegate passwd``; empty = no password check.
    password_file: str = ""
    #: Mosquitto-format ACL file (user/topic/pattern lines), reread when it
    #: changes; empty = no authorization (every client may publish and subscribe).
    acl_file: str = ""
    #: "capture": PUBACK/PUBREC once the frame is durable in the capture log;
    #: "forward": once the AMQP peer accepted the forwarded message.
    ack_after: str = "capture"
    #: Seconds a graceful shutdown waits for connections to close.
    shutdown_grace_s: float = 5.0
    #: Threads that check passwords (scrypt, ~0.1 s and 32 MiB each).
    auth_workers: int = 2
    #: Password checks waiting for a worker; beyond: CONNACK 0x89 (3.x 0x03) at once.
    auth_max_pending: int = 64
    #: Password checks waiting or running per remote address; beyond: 0x89 / 0x03.
    auth_max_pending_per_address: int = 4
    #: After n >= 3 failed checks in a row an address is refused (0x89 / 0x03)
    #: for 0.1 s * 2**(n-3), at most this many seconds; 0 = no back-off.
    auth_failure_backoff_s: float = 10.0
    #: A frame that has started must be complete within this many seconds.
    frame_timeout_s: float = 60.0
    #: Bytes of incomplete frames buffered across all connections; beyond it
    #: the connection whose incomplete frame is the oldest is closed.
    max_buffered_bytes: int = 268435456
    #: Expiry of MQTT 3.x persistent sessions (Clean Session 0) after their
    #: connection ends, like Mosquitto's persistent_client_expiration; 0 = never.
    persistent_session_expiry_s: int = 604800
    #: Persistent sessions kept; beyond it the longest-disconnected are dropped.
    max_persistent_sessions: int = 100000
    #: QoS 2 ids awaiting PUBREL kept across disconnected sessions; beyond it
    #: the longest-disconnected sessions are dropped.
    max_stored_qos2_ids: int = 200000
    #: QoS 1/2 PUBLISH packets the edge sends a subscriber before it must wait
    #: for acknowledgements (MQTT 5: at most the client's Receive Maximum).
    max_inflight_messages: int = 20
    #: Messages queued per session (waiting to be sent, or for a disconnected
    #: persistent session); beyond it the oldest are dropped, counted and logged.
    max_queued_messages: int = 1000
    #: The same bound in payload bytes.
    max_queued_bytes: int = 67108864
    #: Subscriptions one client may hold; a SUBSCRIBE beyond it is refused
    #: per filter (SUBACK 0x97 Quota exceeded; 3.x 0x80).
    max_subscriptions_per_client: int = 1000
    #: Levels a Topic Name or Topic Filter may have (``a/b/c``: 3); like
    #: Mosquitto's TOPIC_HIERARCHY_LIMIT (200, counted in ``/``: one level more).
    #: Deeper: an MQTT 5 PUBLISH gets PUBACK/PUBREC 0x90 Topic Name invalid
    #: (QoS 0: dropped), a 3.x one closes the connection, a SUBSCRIBE filter
    #: gets SUBACK 0x8F Topic Filter invalid (3.x 0x80), a Will topic CONNACK
    #: 0x90 (3.x: closed) [LG-edge-topic-levels].
    max_topic_levels: int = 200
    #: Characters a Topic Name or Topic Filter may have; 65535 is MQTT's own
    #: maximum (as Mosquitto). Beyond: refused as above [LG-edge-topic-length].
    max_topic_length: int = 65535
    #: Retained messages on SUBSCRIBE come from the ``retained`` table: how
    #: often (seconds) the edge looks for a newer version of it.
    retained_refresh_s: float = 1.0
    #: Payloads and properties of retained messages read from the table's
    #: files and kept in memory, at most this many bytes (loading fills it).
    retained_cache_bytes: int = 33554432
    #: Under ``lakegate run``: the edge runs as a supervised child process of
    #: its own (true), with its own interpreter lock, so that the Spark
    #: driver, the live forwarder and the table readers never delay its
    #: acknowledgements; false: a thread of the run's process. ``lakegate
    #: edge`` is always a process of its own.
    own_process: bool = True


@dataclass
class CaptureConfig:
    """The capture log the edge writes and the Spark source reads."""

    #: Where it lives: "local" (files under data_dir/capture, fsynced: the
    #: embedded default) or "kafka" (the topic ``kafka.topic`` of the Kafka
    #: cluster at ``kafka.bootstrap_servers``; section [kafka]).
    backend: str = "local"
    #: Capture stream name (the records' ``topic`` column; on Kafka the
    #: topic's name unless ``kafka.topic`` is set).
    stream: str = "mqtt-frames"
    partitions: int = 4
    segment_bytes: int = 64 * 1024 * 1024
    #: Group commit: what is pending is fsynced at once when the last commit
    #: started this many ms ago or more, else when that interval is over (at
    #: most one commit per interval under load)...
    fsync_interval_ms: int = 2
    #: ...or as soon as this many appends are pending.
    fsync_records: int = 1000
    #: Back-pressure: appends wait once this many bytes are not yet written.
    max_pending_bytes: int = 16 * 1024 * 1024
    #: Retention applies only below the consumer's committed offset.
    retention_age_s: int = 7 * 24 * 3600
    retention_bytes: int = 10 * 1024 * 1024 * 1024
    #: How often the writer applies retention.
    retention_check_interval_s: int = 60


@dataclass
class KafkaConfig:
    """The capture log on Apache Kafka (``capture.backend = "kafka"``): the
    edge produces every accepted frame as one record (librdkafka, idempotent,
    acks=all) and acknowledges it once Kafka has; the job reads the topic
    with Spark's own Kafka source."""

    #: Comma-separated host:port of brokers to start from.
    bootstrap_servers: str = "127.0.0.1:9092"
    #: The topic; empty: ``capture.stream``.
    topic: str = ""
    #: Create the topic when it is missing, with ``capture.partitions``
    #: partitions and ``replication_factor`` replicas; false: a missing topic
    #: is an error at start (one line naming it).
    create_topic: bool = False
    #: Replicas of a topic the edge creates; -1: the brokers' default.
    replication_factor: int = -1
    #: Producer: ms a record may wait to fill a batch (librdkafka linger.ms).
    linger_ms: float = 1.0
    #: Producer: a record not delivered within this many ms fails, and is
    #: never acknowledged (librdkafka delivery.timeout.ms).
    delivery_timeout_ms: int = 30000
    #: Producer: "none", "gzip", "snappy", "lz4" or "zstd".
    compression: str = "none"
    #: "plaintext", "ssl", "sasl_plaintext" or "sasl_ssl" (passed to librdkafka
    #: and to Spark's Kafka source alike).
    security_protocol: str = "plaintext"
    #: SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    sasl_mechanism: str = "PLAIN"
    #: SASL user name.
    sasl_username: str = ""
    #: SASL password (masked wherever the configuration is shown).
    sasl_password: str = ""
    #: TLS: the CA bundle (PEM) to trust; empty: the system's.
    ssl_ca_location: str = ""
    #: TLS client certificate (PEM), when the brokers ask for one.
    ssl_certificate_location: str = ""
    #: Its private key (PEM).
    ssl_key_location: str = ""


@dataclass
class AmqpConfig:
    """AMQP 1.0 forwarding. An empty url turns forwarding off."""

    url: str = "amqp://guest:guest@127.0.0.1:5672"
    #: The kind of AMQP 1.0 peer at ``url``: "rabbitmq" (3.x, its AMQP 1.0
    #: plugin), "artemis" (ActiveMQ Artemis) or "generic" (any other broker
    #: or router: no assumption a plain AMQP 1.0 node would not honour).
    #: Gives the address keys below their values when they are not set
    #: (``bridge.peers``).
    peer: str = "rabbitmq"
    #: Target address per MQTT topic (default: the peer's). Placeholders:
    #: {topic} (verbatim MQTT topic) and {routing_key} (topic with '/' mapped
    #: to '.', for RabbitMQ's ``/topic/<routing key>`` addresses).
    address_template: str = "/topic/{routing_key}"
    #: Space-separated text a topic must not hold once it is part of an
    #: address, because the peer gives it a meaning (a wildcard, a list of
    #: destinations); such a message is quarantined (forward) or rejected
    #: (downlink), LG-amqp-address-chars. Default: the peer's.
    address_refuse: str = ""
    #: Space-separated prefixes of User Property names the peer reads as
    #: orders (Artemis: ``_AMQ_``, e.g. ``_AMQ_DUPL_ID`` drops a later message
    #: as a duplicate); a message with one is quarantined,
    #: LG-amqp-reserved-property. Default: the peer's.
    property_refuse: str = ""
    #: "seed" (the front-end design's mapping) or "enmasse" (its later revision).
    profile: str = "seed"
    #: SASL mechanisms to allow, space separated (PLAIN, ANONYMOUS).
    sasl_mechanisms: str = "PLAIN ANONYMOUS"
    #: User and password when the url carries none (the url wins).
    username: str = ""
    password: str = ""
    tls_ca_file: str = ""
    #: AMQP idle time-out: a peer silent (heartbeats included) for up to twice
    #: this is taken for dead (a black-holed connection) and reconnected.
    idle_timeout_s: float = 5.0
    link_idle_s: float = 300.0
    #: Sender links open at most (2 or more: an address's QoS 0/1 and QoS 2
    #: links must fit together; no unbounded setting: a link per topic is
    #: what stopped RabbitMQ answering, issue 39). A new address takes the
    #: place of the least recently used idle link, or waits for one.
    max_links: int = 1000
    #: The peer's anonymous relay (one link per QoS class, each message's
    #: ``to`` its address), when it offers ANONYMOUS-RELAY: "auto" (only
    #: when address_template is "{topic}", so ``to`` stays the topic),
    #: "on" (with any template: ``to`` is then the address, not the topic)
    #: or "off" (``bridge.amqp.links``).
    anonymous_relay: str = "auto"
    disposition_timeout_s: float = 30.0
    max_retries: int = 5
    retry_backoff_s: float = 0.5
    container_id: str = "lakegate"
    #: rcv-settle-mode of the QoS 2 sender link: "profile" (seed: first,
    #: enmasse: second), "first" or "second". RabbitMQ 3.x refuses "second".
    qos2_rcv_settle_mode: str = "profile"
    #: AMQP -> MQTT (the edge's receiving links, ``bridge.edge.downlink``):
    #: off unless true (the edge then receives from ``url``).
    downlink: bool = False
    #: Each connected client's own address ({client_id}); default: the
    #: peer's (the seed's ``$mqtt.to.{client_id}`` for "generic"; RabbitMQ
    #: 3.x takes only its own address forms: ``/queue/mqtt.to.{client_id}``,
    #: a queue it keeps while the client is away). Empty: no per-client links.
    client_address_template: str = "/queue/mqtt.to.{client_id}"
    #: The one topic link of the edge (messages sent to a topic address,
    #: matched against the edge's subscriptions); default: the peer's;
    #: empty: none.
    downlink_topic_address: str = "/topic/#"
    #: Unsettled messages the topic link holds at most (its credit).
    downlink_credit: int = 100
    #: QoS 2 to a subscriber: "peer" (the seed: PUBREL to the client once the
    #: AMQP side sends AMQP_PUBREL) or "edge" (the edge sends PUBREL at PUBREC).
    downlink_pubrel: str = "peer"
    #: Who forwards to AMQP: "edge" (the process hosting the edge, as records
    #: become durable: ``bridge.amqp.live``), "job" (the Spark job, per
    #: micro-batch) or "auto" (``lakegate run``: the edge; ``lakegate
    #: process`` and spark-submit: the job; ``lakegate edge``: nobody).
    forward_by: str = "auto"
    #: Live forwarding: how long after a range began the next one starts
    #: (at once if the range took longer; records gather meanwhile; idle,
    #: it waits for the edge's next commit), and the most records it
    #: forwards in one range.
    live_interval_ms: int = 100
    live_max_records: int = 20000


@dataclass
class TablesConfig:
    """Delta tables under ``data_dir``."""

    #: "auto" (delta-spark when its JVM classes are present, else delta-rs),
    #: "delta-rs" or "delta-spark".
    engine: str = "auto"
    compact_interval_s: int = 3600
    vacuum_retention_hours: int = 168


@dataclass
class TapConfig:
    """``lakegate tap``: capture from an existing broker through a subscription."""

    #: mqtt://HOST:PORT (mqtts:// for TLS) of the broker to tap.
    broker: str = ""
    #: Topic filter to subscribe to (``--topic`` may give several).
    topic: str = "#"
    client_id: str = "lakegate-tap"
    username: str = ""
    password: str = ""
    #: MQTT 5 Session Expiry Interval: how long the broker keeps the tap's
    #: session (and queues its messages) while the tap is down.
    session_expiry_s: int = 86400
    keepalive_s: int = 60
    tls_ca_file: str = ""


@dataclass
class JobConfig:
    """The streaming job (``jobs/process_packets.py``, ``lakegate process``)."""

    #: A micro-batch at most this often. 5 s: the efficiency mode (issue 25).
    #: With live forwarding (``lakegate run``'s default) the trigger decides
    #: only how fresh the tables are; a job that forwards (``amqp.forward_by
    #: = "job"``, ``lakegate process``, spark-submit) adds it to AMQP
    #: latency: set 1 s or less there (the latency mode).
    trigger_interval_s: float = 5.0
    max_records_per_trigger: int = 500000
    query_name: str = "lakegate"
    #: a batch with at most this many rows to forward is forwarded from the
    #: driver (the batch is there already: no Spark job, no Python worker);
    #: larger ones from the executors, in parallel. 0: always the executors.
    forward_on_driver_max_rows: int = 2000
    #: a batch of at most this many capture records is parsed on the driver
    #: (the records as Arrow, the same parser: no second Python-worker hop,
    #: no UDF to plan); larger ones by the pandas UDF on the executors. The
    #: default equals max_records_per_trigger's default, so every batch is
    #: (raise both together), since the tables are written from the
    #: driver's Arrow copy of the batch either way
    #: (160,000 records: 2.0 s a batch against the UDF's 4.4 s). A job that
    #: forwards parses on the driver only a batch it also forwards from
    #: there. 0: always the pandas UDF on the executors.
    parse_on_driver_max_rows: int = 500000
    #: ``lakegate run`` with the edge in its own process (``edge.own_process``):
    #: the niceness the run adds to its own work, the Spark driver and JVM and
    #: the live forwarder, so that when the CPUs are busy the edge's
    #: acknowledgements come first and the tables and forwarding catch up
    #: from the durable log (0-19; 0: the same priority as the edge).
    run_nice: int = 10


@dataclass
class SparkConfig:
    """Spark session settings (spark-submit's own --master wins)."""

    master: str = "local[*]"
    app_name: str = "lakegate"
    driver_memory: str = "2g"
    shuffle_partitions: int = 4
    ui_enabled: bool = False
    log_level: str = "WARN"
    #: JVM options of a local session's JVM (driver and executors in one; not
    #: under spark-submit, whose --driver-java-options win). C1 only: the JIT's
    #: C2 compiler threads were half the JVM's CPU in a small deployment; the
    #: serial collector: G1's concurrent threads were two thirds of what was
    #: left (docs/job.md, "The local JVM"); "" for the JVM's defaults.
    java_options: str = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    #: where the local JVM's class-data-sharing archives live
    #: (``bridge.spark.class_archive``; ``lakegate jvm-archive`` makes one):
    #: "auto" is $XDG_CACHE_HOME/lakegate or ~/.cache/lakegate; "" uses none.
    class_archive_dir: str = "auto"


@dataclass
class SqlConfig:
    """The Spark Connect endpoint of ``lakegate run`` / ``lakegate process``
    (``bridge.sqlserve``): ``lakegate sql``, the notebooks and any Spark
    Connect client query the tables through it."""

    #: Loopback by default. Any other address needs ``connect_token`` (Spark
    #: Connect's bearer token; the server has no TLS of its own: put a TLS
    #: proxy in front of it to leave the host).
    connect_host: str = "127.0.0.1"
    #: Spark Connect's usual port; 0 turns the endpoint off.
    connect_port: int = 15002
    #: Token a client must present (``sc://host:port/;token=...``); empty: none.
    connect_token: str = ""
    #: With delta-spark: whether SQL may run ``OPTIMIZE``, ``REORG TABLE`` and
    #: ``VACUUM`` (the endpoint's clients, ``lakegate sql``); off, they are
    #: refused in one line (``VACUUM ... DRY RUN`` is not: it deletes
    #: nothing), and ``lakegate compact`` and the job's schedule do the
    #: maintenance. Never a ``VACUUM ... RETAIN`` below
    #: ``tables.vacuum_retention_hours``.
    allow_maintenance: bool = False


@dataclass
class MetricsConfig:
    """Prometheus ``/metrics`` and ``/healthz`` of ``lakegate run`` (``bridge.metrics``)."""

    host: str = "127.0.0.1"
    #: 0 turns the endpoint off.
    port: int = 9883
    #: /healthz fails when records wait in the log and the last batch is older than this.
    max_batch_age_s: float = 120.0


@dataclass
class ClusterConfig:
    """Several edges as one MQTT service on one Kafka capture topic
    (``capture.backend = "kafka"``; ``docs/cluster.md``): every edge has the
    same configuration but its ``edge_id``, writes its own partitions of the
    topic and delivers to its subscribers what every other edge captured."""

    #: Edges in the cluster; 1: a single edge (no cluster).
    edges: int = 1
    #: This edge's id, 0 .. edges - 1: it writes the partitions p with p % edges == edge_id.
    edge_id: int = 0
    #: Seconds without a beat after which the other edges declare an edge dead (its
    #: sessions move, its Wills are published); an edge beats every tenth of it, and
    #: closes its connections when no beat was confirmed for half of it. Half of it must
    #: exceed the Kafka cluster's fail-over (a broker's broker.session.timeout.ms, 9 s by
    #: default, plus elections: 12 s and more measured on 2 busy cores), or a broker's
    #: death closes every edge's connections.
    lease_s: float = 60.0

    def problem(self, capture: CaptureConfig) -> tuple[str, str] | None:
        """(key, what is wrong) when the cluster's keys do not fit together
        with the capture log's, else None [LG-cluster-config]."""
        if self.edges <= 1:
            return None
        if capture.backend != "kafka":
            return "cluster.edges", (f"{self.edges} edges share one capture log on Kafka: set "
                                     'capture.backend = "kafka" [LG-cluster-config]')
        if capture.partitions < self.edges:
            return "cluster.edges", (f"{self.edges} edges need at least as many capture partitions, each edge "
                                     f"writing its own; capture.partitions is {capture.partitions} "
                                     "[LG-cluster-config]")
        if self.edge_id >= self.edges:
            return "cluster.edge_id", (f"must be 0-{self.edges - 1} (cluster.edges = {self.edges}), got "
                                       f"{self.edge_id} [LG-cluster-config]")
        return None
