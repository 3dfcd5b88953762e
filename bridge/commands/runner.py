"""``lakegate run``: the edge and the streaming job in one process.

* The edge (``bridge.edge.server.EdgeServer``) runs in a supervised child
  process of its own (``edge.own_process``, the default:
  ``bridge.job.edge_process``), with its own interpreter lock, or on its
  own asyncio loop in a thread of this process; either way it captures and
  acknowledges whatever happens to the job. A child killed by a signal
  (the out-of-memory killer) is started again on the same ports, with
  backoff; one whose capture log failed stops the run (exit 1).
* Java is checked first (local Spark needs Java 17+): without it the
  command says what to install in one line and starts nothing.
* AMQP forwarding (``amqp.url`` set) is live by default: a thread next to
  the edge forwards records as they become durable
  (``bridge.amqp.live``), and the job writes the tables only;
  ``amqp.forward_by = "job"`` forwards from the micro-batches instead.
* The job runs under a supervisor on the main thread: when a micro-batch
  fails (for example, with ``forward_by = "job"``, the AMQP peer is
  unreachable and the forwarder gave up after its retries), the supervisor logs one line, waits with backoff and
  starts the query again from its checkpoint. The tables skip what they
  already committed and forwarding sends the batch again, so forwarding
  catches up when the peer appears: nothing lost, nothing skipped. The
  backoff starts over once a restarted query completes a batch. The
  progress listener is the same across restarts (``bridge.job.pipeline``).
* The Spark JVM is a child process of a local session; when it dies alone
  (the kernel's out-of-memory killer picks the biggest process, and that is
  the JVM), the supervisor logs one line naming how it ended, forgets the
  session (``bridge.spark.jvm``), waits with the same backoff and builds a
  new session, whose query resumes from the checkpoint. The edge keeps
  accepting, capturing and acknowledging meanwhile.
* SIGINT/SIGTERM: the edge stops accepting, closes connections (MQTT 5:
  DISCONNECT 0x8B) and fsyncs; the query finishes the batch it is running
  (no new batch starts), then stops; the Spark session ends.
* With the edge in its own process, the run's own threads and the Spark
  JVM take ``job.run_nice`` (10): under CPU pressure the edge's
  acknowledgements come first; the tables and forwarding catch up from the
  durable capture log.
* ``data_dir/run.pid`` exists while the edge runs; it is removed on every
  way out but SIGKILL (``running_run`` checks that its pid is alive). It
  names the run's pid, the edge's addresses and, in a process of its own,
  the edge's pid (``edge_pid``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

from bridge.amqp.live import forwards_live
from bridge.amqp.reachable import amqp_reachable
from bridge.config import Config, mask_secret
from bridge.job.failures import root_cause
from bridge.job.run_edge import EdgeThread, new_edge

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from bridge.amqp.live import LiveForwarder
    from bridge.job.edge_process import EdgeProcess

__all__ = ["EdgeThread", "RUN_PID_FILE", "Runner", "running_run"]

log = logging.getLogger("bridge.run")

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: ``lakegate run`` writes {"pid", "edge": [[host, port, tls], ...]} here while it runs.
RUN_PID_FILE = "run.pid"


#: Modules the job imports after the Spark session is up (parser, pandas UDF,
#: tables, forwarding): imported on a thread while the JVM starts, which the
#: main thread only waits for (``warm_imports``).
WARM_MODULES = ("pandas", "pyarrow", "pyarrow.compute", "pyspark.sql.pandas.functions", "bridge.parse.udf",
                "bridge.job.batch", "bridge.job.progress", "bridge.spark.source", "bridge.tables.deltars",
                "bridge.amqp.sink", "bridge.amqp.sender")


def warm_imports(modules: tuple[str, ...] = WARM_MODULES) -> threading.Thread:
    """Import ``modules`` on a daemon thread (returned, started). Part of
    ``lakegate run``'s start-up: some 0.5 s of imports overlap the JVM's
    4-5 s start instead of following it. A module that fails to import is
    left alone: the import where it is used reports it. PySpark's own
    modules are imported first, on the calling thread (the session needs
    them at once anyway): two threads importing the same package's modules
    in different orders can deadlock on Python's module locks
    (``_DeadlockError``, seen when the warm thread was inside
    ``pyspark.sql.pandas`` while the session imported ``pyspark.sql``)."""
    import importlib

    import pyspark.sql  # noqa: F401 - see above

    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - reported where the module is used
                log.debug("warm import of %s failed: %s", name, exc)

    t = threading.Thread(target=run, name="warm-imports", daemon=True)
    t.start()
    return t


def running_run(config: Config) -> dict | None:
    """The pid file of a ``lakegate run`` that is alive on this data_dir, else None."""
    p = config.data_path / RUN_PID_FILE
    try:
        info = json.loads(p.read_text())
        os.kill(int(info["pid"]), 0)
        return info
    except (OSError, ValueError, KeyError):
        return None


#: an edge process that ran this long before it died starts again at once (the backoff starts over)
EDGE_STABLE_S = 60.0


class Runner:
    """Edge + supervised job (see module doc)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._stop = threading.Event()
        #: AMQP forwarding as records become durable (``amqp.forward_by``), else None: the job forwards
        self.live: "LiveForwarder | None" = None
        #: The current session (a new one after the JVM died).
        self.spark: "SparkSession | None" = None
        self._own_session = False
        #: the session whose SQL-endpoint catalog objects were asked for (once per session)
        self._catalog_session: "SparkSession | None" = None

    def request_stop(self, *_: object) -> None:
        if not self._stop.is_set():
            log.info("stopping: edge stops accepting and fsyncs, the job finishes its batch")
        self._stop.set()

    def run(self, spark: "SparkSession | None" = None) -> int:
        from bridge.job.pipeline import shutdown
        from bridge.spark.session import under_spark_submit

        cfg = self.config
        own_session = self._own_session = spark is None
        if own_session and not under_spark_submit():
            from bridge.javacheck import require_java

            require_java()  # JavaMissing (one line, exit 2) before the edge or run.pid exist
        if own_session:
            from bridge.sqlserve.endpoint import check_port

            check_port(cfg)  # ConfigError (one line, exit 2): the SQL endpoint's port is taken
        from bridge.metrics.wiring import metrics_server

        self._handle_signals()
        edge = self.edge = new_edge(cfg)
        self._edge_restarts = 0
        pid_file = cfg.data_path / RUN_PID_FILE
        wrote_pid = False
        self._query = None
        live = forwards_live(cfg, hosts_edge=True, runs_job=True)
        metrics = metrics_server(cfg, edge, self._query_active,  # ConfigError when its port is taken
                                 live=(lambda: self.live) if live else None)
        try:
            addresses = edge.start()
            self._yield_cpu_to_edge()
            if live:
                from bridge.amqp.live import LiveForwarder

                self.live = LiveForwarder(cfg)
                edge.wake_on_durable(self.live)
                self.live.start()
            if metrics is not None:
                metrics.start()
            self._write_pid(addresses)
            wrote_pid = True
            shown = ", ".join(f"{'mqtts' if tls else 'mqtt'}://{h}:{p}" for h, p, tls in addresses)
            print(f"lakegate run: edge on {shown}; data in {cfg.data_path}", flush=True)
            if cfg.amqp.url:
                peer = mask_secret("amqp.url", cfg.amqp.url)
                how = "live, as records become durable" if self.live is not None else "by the job, per micro-batch"
                if amqp_reachable(cfg.amqp.url):
                    print(f"lakegate run: forwarding to {peer} ({how})", flush=True)
                else:
                    print(f"lakegate run: AMQP peer {peer} is unreachable; capturing continues and "
                          "forwarding catches up when it appears", flush=True)
            else:
                print("lakegate run: AMQP forwarding off (amqp.url is empty)", flush=True)
            if self._stop.is_set():
                return 0
            if spark is None:
                warm_imports()
            self.spark = spark if spark is not None else self._new_session()
            return self._supervise(self.spark, edge)
        finally:
            if metrics is not None:
                metrics.stop()
            edge.stop(cfg.edge.shutdown_grace_s + 10)
            if self.live is not None:
                self.live.stop()  # after the edge: what it made durable is forwarded first (bounded)
            edge.close()
            if own_session and self.spark is not None:
                from bridge.spark.jvm import discard_session, jvm_exit

                if jvm_exit(self.spark) is None:
                    shutdown(self.spark)
                else:
                    discard_session(self.spark)
            if wrote_pid:  # not another run's file (a second run on this data_dir fails at edge.start)
                pid_file.unlink(missing_ok=True)

    def _yield_cpu_to_edge(self) -> None:
        """With the edge in a process of its own: the run's own work takes
        ``job.run_nice`` (module doc). On Linux a niceness belongs to a
        thread; the threads and processes this one starts from now on (the
        live forwarder, the Spark JVM, the metrics endpoint) inherit it; the
        edge's process, started before, keeps its own."""
        nice = self.config.job.run_nice
        if not nice or self.edge.pid is None:
            return
        try:
            os.nice(nice)
        except OSError as exc:
            log.warning("job.run_nice: cannot lower this process's priority (%s); the edge shares the CPU "
                        "equally with the job", exc)
            return
        log.info("run: the job and the forwarder run at niceness +%d: when the CPUs are busy the edge's "
                 "process (pid %d) comes first", nice, self.edge.pid)

    def _write_pid(self, addresses: list[tuple[str, int, bool]]) -> None:
        info: dict = {"pid": os.getpid(), "edge": [[h, p, t] for h, p, t in addresses]}
        if self.edge.pid is not None:
            info["edge_pid"] = self.edge.pid
        path = self.config.data_path / RUN_PID_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, path)  # a reader never sees half a file

    def _edge_down(self, edge: "EdgeThread | EdgeProcess") -> bool:
        """The edge is not running and nobody asked: start it again when a
        signal killed its process (True: it runs again), else log why the run
        stops (False)."""
        from bridge.spark.jvm import describe_exit

        if edge.stopped_from_outside:
            log.info("edge: its process (pid %s) stopped on a signal sent to both; the run stops too", edge.pid)
            return False
        if not edge.restartable:
            how = edge.exit_status
            log.error("the edge stopped: %s", edge.failed or edge.error or (
                f"its process (pid {edge.pid}) {describe_exit(how)}" if how is not None else "unknown reason"))
            return False

        if time.monotonic() - edge.started_at >= EDGE_STABLE_S:
            self._edge_restarts = 0
        delay = 0.0 if self._edge_restarts == 0 else BACKOFF_S[min(self._edge_restarts - 1, len(BACKOFF_S) - 1)]
        self._edge_restarts += 1
        from bridge.capture.errors import EXIT_UNAVAILABLE

        how = describe_exit(edge.exit_status)
        if edge.exit_status == EXIT_UNAVAILABLE:  # Kafka down: it said why (its own line, or `failed`)
            how = f"stopped: {edge.failed or 'its capture log did not answer'}"
        log.error("edge: its process (pid %s) %s; starting it again on the same ports%s; what it acknowledged is "
                  "in the capture log, its sessions come back from its journal", edge.pid, how,
                  f" in {delay:.0f}s" if delay else "")
        if self._stop.wait(delay):
            return True
        try:
            self._write_pid(edge.restart())
        except Exception as exc:  # noqa: BLE001 - the next look tries again, with backoff
            log.error("edge: could not start it again: %s", exc)
        return True

    def _query_active(self) -> bool:
        """For /healthz (the metrics thread): is the streaming query running?"""
        q = self._query
        return q is not None and self._jvm_died() is None and bool(q.isActive)

    def _new_session(self) -> "SparkSession":
        from bridge.spark.jvm import quiet_accumulator_server
        from bridge.spark.session import build_session

        from bridge.sqlserve import endpoint

        endpoint.export_tables_dir(self.config)
        spark = build_session(self.config, app_name="lakegate-run", extra=endpoint.spark_conf(self.config))
        endpoint.guard(spark, self.config)  # before any Connect client's first query (its rules are fixed then)
        quiet_accumulator_server(spark)
        # the endpoint's catalog objects come once the query has started (_install_catalog)
        # Again after the session: PySpark's SparkContext installs its own SIGINT
        # handler (cancel all jobs, raise KeyboardInterrupt); ours finishes the batch.
        self._handle_signals()
        return spark

    def _install_catalog(self) -> None:
        """The SQL endpoint's catalog objects (``bridge.sqlserve.endpoint.install``)
        in this session, once, on a thread: after the query has started, so
        that they do not delay it (creating them took 2 s of a 9-10 s start;
        the SQL session's first use is the query's). The endpoint answers
        from the session's start (``lakegate sql`` and the notebooks make
        their own views); other Connect clients see the tables once the
        line "sql: Spark Connect endpoint on ..." is logged."""
        spark = self.spark
        if not (self._own_session and self.config.sql.connect_port) or spark is None \
                or spark is self._catalog_session:
            return
        self._catalog_session = spark
        from bridge.sqlserve import endpoint

        endpoint.install_in_background(spark, self.config, going_away=lambda: (
            self._stop.is_set() or spark is not self.spark or self._jvm_died() is not None))

    def _jvm_died(self, wait_s: float = 0.0) -> int | None:
        """The exit status of this process's own Spark JVM once it has exited, else None."""
        from bridge.spark.jvm import jvm_exit

        return jvm_exit(self.spark, wait_s) if self._own_session and self.spark is not None else None

    def _handle_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self.request_stop)

    def _supervise(self, spark: "SparkSession", edge: EdgeThread) -> int:
        self.spark = spark
        failures = 0  # consecutive runs of the query that failed without completing a batch
        if spark is not None:
            from bridge.job.pipeline import progress_listener

            progress_listener(spark, self.config).supervised = True  # one line per failure: ours
        while not self._stop.is_set():
            try:
                outcome = self._run_query(edge)
            except Exception:
                if self._jvm_died(wait_s=5.0) is None:
                    raise
                outcome = "jvm"
            if outcome == "jvm" and self._stop.is_set():
                self._jvm_exited_while_stopping()
                outcome = "stopped"
            if outcome == "stopped":
                return 1 if edge.failed else 0
            delay = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
            if outcome == "jvm":
                self._restart_session(delay)
                failures += 1
                continue
            query, failure = outcome
            if failures and query.lastProgress is not None:  # this run completed a batch before it failed
                log.info("job: the restarted query had completed a batch; backoff starts over")
                failures = 0
                delay = BACKOFF_S[0]
            failures += 1
            log.warning("job: micro-batch failed (%s); capture continues; restarting from the checkpoint in %.0fs",
                        (failure or "query stopped")[:300], delay)
            self._stop.wait(delay)
        return 0

    def _run_query(self, edge: EdgeThread):
        """One run of the query: "stopped" (stop requested), "jvm" (the JVM
        exited) or (query, failure) when it ended by itself."""
        from pyspark.errors import StreamingQueryException

        from bridge.job.pipeline import job_forwards, start_query

        query = self._query = start_query(self.spark, self.config, stop=self._stop,
                                          forwarding=job_forwards(self.config, live_elsewhere=self.live is not None))
        self._install_catalog()
        failure: str | None = None
        while not self._stop.is_set() and query.isActive:
            if not edge.alive and not self._stop.is_set() and not self._edge_down(edge):
                self._stop.set()
                break
            if self._jvm_died() is not None:
                return "jvm"
            try:
                query.awaitTermination(1)
            except StreamingQueryException as exc:
                failure = root_cause(str(exc))
                break
        if self._stop.is_set():
            if self._jvm_died() is None:
                self._finish(query, edge)
            return "stopped"
        return query, failure

    def _drop_dead_session(self) -> tuple[object, str]:
        """Forget the session whose JVM exited; its pid and how it exited, for the log line."""
        from bridge.job.pipeline import forget
        from bridge.spark.jvm import describe_exit, discard_session, jvm_pid

        pid, how = jvm_pid(self.spark), describe_exit(self._jvm_died())
        forget(self.spark)
        discard_session(self.spark)
        self.spark = None
        return pid, how

    def _jvm_exited_while_stopping(self) -> None:
        """The JVM exited while the run was stopping: it got the signal too
        (systemd's default KillMode, ``timeout``, a terminal's SIGTERM to the
        process group). Nothing is lost: what the edge acknowledged is in the
        capture log, and a batch the JVM left unfinished runs again from the
        checkpoint at the next start (its tables under the app transaction)."""
        pid, how = self._drop_dead_session()
        log.warning("job: the Spark JVM (pid %s) %s while lakegate run was stopping (it got the signal too); "
                    "a batch it had not finished runs again from the checkpoint at the next start", pid, how)

    def _restart_session(self, delay: float) -> None:
        """The JVM exited: one line saying how, forget its session, wait, build a new one."""
        pid, how = self._drop_dead_session()
        log.error("job: the Spark JVM (pid %s) %s; the edge keeps capturing; starting a new Spark session "
                  "in %.0fs, the query resumes from its checkpoint", pid, how, delay)
        if self._stop.wait(delay):
            return
        self.spark = self._new_session()

    def _finish(self, query, edge: EdgeThread) -> None:
        """Stop the edge first (no new data), then let the query finish its batch."""
        from bridge.job.pipeline import stop_after_batch

        edge.stop(self.config.edge.shutdown_grace_s + 10)
        stop_after_batch(query)
