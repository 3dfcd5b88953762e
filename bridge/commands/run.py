"""``lakegate run``: the edge and the streaming job together (the embedded default).

Edge on ``edge.host:edge.port``, the job on a local Spark session, AMQP
forwarding when ``amqp.url`` is set. An unreachable peer is reported in one
line; capture continues and forwarding catches up when the peer appears.
Ctrl-C stops cleanly: the edge stops accepting and fsyncs, the query
finishes its batch. ``tables.engine = "delta-spark"`` without delta-spark's
jars (``.jvm/lib/delta``: ``scripts/bootstrap``) is one line, exit 2, before
anything starts.
"""

from __future__ import annotations

import argparse

from bridge.config import Config


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.commands.runner import Runner
    from bridge.spark.delta import require_jars

    require_jars(config)  # JarsUnusable (one line, exit 2): delta-spark asked for, its jars absent
    return Runner(config).run()
