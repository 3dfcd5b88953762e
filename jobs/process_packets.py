"""spark-submit entry point: the lakegate streaming job.

    spark-submit --properties-file conf/spark-defaults.conf \
        jobs/process_packets.py --config conf/lakegate.toml [--set KEY=VALUE ...] [--once]

Capture log (``capture.backend``: the local log, or a Kafka topic read with
Spark's Kafka source) -> parse -> Delta tables (messages, retained, quarantine) -> AMQP
forwarding, with its checkpoint under data_dir. All logic lives in the
package (bridge.job.pipeline); this file only parses arguments, builds the
session and runs the job. Exit codes as ``lakegate process``: 0, 1 when the
query failed, 2 for a bad configuration, a missing Java or unusable jars (one
line on stderr: a jar of another Spark or Scala line in spark.jars, or
tables.engine = "delta-spark" without delta-spark on the classpath; see
docs/job.md, "JVM jars under spark-submit").
"""

import argparse
import sys

from bridge.cli import setup_logging
from bridge.config import ConfigError, load_config
from bridge.javacheck import JavaMissing
from bridge.job.pipeline import run_job, shutdown
from bridge.spark.delta import require_jars
from bridge.spark.executor_python import ExecutorPythonError
from bridge.spark.session import build_session

p = argparse.ArgumentParser(description="lakegate streaming job")
p.add_argument("--config", help="TOML configuration (default: built-in = conf/lakegate.toml)")
p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
p.add_argument("--once", action="store_true", help="process everything available, then exit")
args = p.parse_args()
try:
    config = load_config(args.config, args.overrides)
    setup_logging(config)
    require_jars(config)  # run without spark-submit (python jobs/process_packets.py): .jvm/lib/delta
    spark = build_session(config, app_name="lakegate-job")  # under spark-submit: checks the jars it was given
except (ConfigError, JavaMissing, ExecutorPythonError) as exc:  # JarsUnusable is a ConfigError
    msg = str(exc)
    print(msg if msg.startswith("lakegate:") else f"lakegate: {msg}", file=sys.stderr)
    sys.exit(2)
if config.capture.backend == "kafka":  # Spark's Kafka source (.jvm/lib/kafka, spark.jars) must be there
    from bridge.spark.kafka_source import require_kafka_source

    try:
        require_kafka_source(spark, config)
    except ConfigError as exc:
        print(f"lakegate: {exc}", file=sys.stderr)
        shutdown(spark)
        sys.exit(2)
try:
    code = run_job(spark, config, once=args.once)
finally:
    shutdown(spark)
sys.exit(code)
