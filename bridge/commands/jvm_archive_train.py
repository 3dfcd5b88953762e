"""The training run of the JVM class archive (:mod:`bridge.spark.class_archive`):
a child process that loads what ``lakegate run`` loads (the job's query, the
SQL endpoint), then lets the JVM exit and dump the classes it loaded. Here,
at the top layer, because it drives the job and the endpoint, which sit
above ``bridge.spark`` (ARCHITECTURE.md, the import contract)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

__all__ = ["main", "train"]


def train(dump_to: Path, work: Path, java_options: str) -> int:
    """The child process of :func:`bridge.spark.class_archive.build`: load
    what a run loads, then let the JVM exit and dump."""
    from bridge.capture import CaptureLog
    from bridge.config import load_config
    from bridge.job.pipeline import release, start_query
    from bridge.mqtt import Publish, encode
    from bridge.ports import free_loopback_port
    from bridge.spark.session import build_session
    from bridge.sqlserve import endpoint

    port = free_loopback_port()
    sets = [f"data_dir={work}", "amqp.url=", "spark.class_archive_dir=", f"sql.connect_port={port}",
            "job.max_records_per_trigger=20", "log_level=WARNING",
            f"spark.java_options={java_options} -XX:ArchiveClassesAtExit={dump_to}"]
    cfg = load_config(None, sets, env={})
    capture = CaptureLog.open(cfg.capture_dir, cfg.capture)
    acks = [capture.append("train", b"train", encode(Publish(qos=1, topic=f"t/{i % 3}", packet_id=i + 1,
                                                              payload=b"x", retain=i % 2 == 0), 5),
                           [("conn_id", b"train"), ("proto", b"5")]) for i in range(40)]
    for a in acks:
        a.wait(30)
    capture.close()
    endpoint.export_tables_dir(cfg)
    spark = build_session(cfg, app_name="lakegate-jvm-archive", extra=endpoint.spark_conf(cfg))
    proc = spark.sparkContext._gateway.proc  # the JVM: it dumps the archive when it exits
    try:
        endpoint.install(spark, cfg)
        query = start_query(spark, cfg, once=True)  # batch 0 by the pandas UDF, the next on the driver
        if not query.awaitTermination(180) or query.exception() is not None:
            print(f"training query did not finish: {query.exception()}", file=sys.stderr)
            return 1
        spark.sql("SELECT count(*) FROM retained").collect()
        release(spark)
    finally:
        spark.stop()
    proc.stdin.close()  # PySpark's gateway exits at the end of its stdin
    return 0 if proc.wait(120) == 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="training run of a JVM class archive (bridge.spark.class_archive.build)")
    p.add_argument("--dump-to", required=True, type=Path)
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--java-options", default="")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return train(a.dump_to, a.work, a.java_options)


if __name__ == "__main__":
    sys.exit(main())
