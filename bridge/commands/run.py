"""``lakegate run``: the edge and the streaming job together (the embedded default).

Edge on ``edge.host:edge.port``, the job on a local Spark session, AMQP
forwarding when ``amqp.url`` is set. An unreachable peer is reported in one
line; capture continues and forwarding catches up when the peer appears.
Ctrl-C stops cleanly: the edge stops accepting and fsyncs, the query
finishes its batch. ``tables.engine = "delta-spark"`` without delta-spark's
jars (``.jvm/lib/delta``: ``scripts/bootstrap``) is one line, exit 2, before
anything starts; so is ``cluster.edges`` > 1 (a cluster runs ``lakegate
edge`` per member and ``lakegate process`` once).
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
    if config.cluster.edges > 1:
        from bridge.cli import UsageError

        # one run per member would forward every message once per member; untested, so refused
        raise UsageError("lakegate run is one edge with the job; a cluster (cluster.edges = "
                         f"{config.cluster.edges}) runs lakegate edge on each member and lakegate process once "
                         "(docs/cluster.md) [LG-cluster-config]")
    return Runner(config).run()
