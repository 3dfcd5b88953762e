"""spark-submit entry point: the lakegate streaming job.

    spark-submit --properties-file conf/spark-defaults.conf \
        jobs/process_packets.py --config conf/lakegate.toml [--set KEY=VALUE ...] [--once]

Capture log -> parse -> Delta tables (messages, retained, quarantine) -> AMQP
forwarding, with its checkpoint under data_dir. All logic lives in the
package (bridge.job.pipeline); this file only parses arguments, builds the
session and awaits the query.
"""

import argparse
import sys

from bridge.cli import setup_logging
from bridge.config import ConfigError, load_config
from bridge.job.pipeline import shutdown, start_query
from bridge.spark.session import build_session

p = argparse.ArgumentParser(description="lakegate streaming job")
p.add_argument("--config", help="TOML configuration (default: built-in = conf/lakegate.toml)")
p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
p.add_argument("--once", action="store_true", help="process everything available, then exit")
args = p.parse_args()
try:
    config = load_config(args.config, args.overrides)
except ConfigError as exc:
    sys.exit(f"lakegate: {exc}")
setup_logging(config)
spark = build_session(config, app_name="lakegate-job")
try:
    start_query(spark, config, once=args.once).awaitTermination()
finally:
    shutdown(spark)
