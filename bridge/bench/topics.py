"""Subscription tree (:mod:`bridge.edge.topics`): memory and match rate.

Memory is measured with :mod:`tracemalloc` (Python allocations only, which
is all the tree makes): N clients x K subscriptions each, in two shapes,

* ``own``: each subscription a filter of its own,
  ``site/{area}/{client}/{i}/+`` (the worst case for the trie: one leaf per
  subscription, a node per client);
* ``common``: every client subscribes to the same K filters
  (``site/{i}/#``), one node per filter, N entries at each;

counting everything the subscriptions hold: the tree, the ``Sub`` objects,
their Client Identifiers and filters. Then every client is removed and what
is left is measured (pruning: should be near zero).

The match rate is ``match()`` calls per second for a topic matching 1
subscription and one matching 100 (100 clients on ``fan/+``), in a tree that
also holds the N x K ``own`` subscriptions that do not match: it must not
depend on N.

Run ``python -m bridge.bench.topics [--json]``; with ``add_arguments`` and
``run`` it can be listed in ``bridge.commands.bench.BENCHES``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc

from bridge.edge.subscription import Sub
from bridge.edge.topics import SubscriptionTree

__all__ = ["add_arguments", "measure", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=int, default=10_000)
    p.add_argument("--per-client", type=int, default=10, help="subscriptions per client")
    p.add_argument("--seconds", type=float, default=1.0, help="time per match-rate measurement")
    p.add_argument("--json", action="store_true")


def _build(clients: int, per_client: int, shape: str) -> SubscriptionTree:
    tree = SubscriptionTree()
    for c in range(clients):
        cid = f"device-{c:08d}"
        for i in range(per_client):
            tf = f"site/{c % 100}/{cid}/{i}/+" if shape == "own" else f"site/{i}/#"
            tree.add(Sub(cid, tf, 1, sub_id=i + 1))
    return tree


def _memory(clients: int, per_client: int, shape: str) -> dict:
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tree = _build(clients, per_client, shape)
        gc.collect()
        full = tracemalloc.get_traced_memory()[0] - base
        for c in range(clients):
            tree.remove_client(f"device-{c:08d}")
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    n = clients * per_client
    return {"shape": shape, "clients": clients, "subscriptions": n, "bytes": full,
            "mb": round(full / 1e6, 1), "bytes_per_subscription": round(full / max(n, 1)),
            "bytes_after_removing_all": left, "len_after_removing_all": len(tree)}


def _rate(tree: SubscriptionTree, topic: str, seconds: float) -> float:
    count, t0 = 0, time.perf_counter()
    deadline = t0 + seconds
    while True:
        for _ in range(1000):
            tree.match(topic)
        count += 1000
        now = time.perf_counter()
        if now >= deadline:
            return count / (now - t0)


def measure(clients: int, per_client: int, seconds: float) -> dict:
    mem = [_memory(clients, per_client, shape) for shape in ("own", "common")]
    rates = []
    for n in (0, clients):
        tree = _build(n, per_client, "own")
        tree.add(Sub("one", "one/+/x", 1))
        for c in range(100):
            tree.add(Sub(f"fan-{c}", "fan/+", 0))
        if len(tree.match("one/a/x").direct) != 1 or len(tree.match("fan/a").direct) != 100:
            raise RuntimeError("bench topics: the tree does not match what it was given")
        rates.append({"other_subscriptions": n * per_client,
                      "match_1_per_s": round(_rate(tree, "one/a/x", seconds)),
                      "match_100_per_s": round(_rate(tree, "fan/a", seconds))})
    return {"memory": mem, "match": rates}


def run(args: argparse.Namespace, config=None) -> int:
    res = measure(args.clients, args.per_client, args.seconds)
    if args.json:
        print(json.dumps(res))
        return 0
    print("subscription tree memory (tracemalloc: tree + Subs + client ids + filters)")
    for m in res["memory"]:
        print(f"  {m['shape']:>6}: {m['clients']} clients, {m['subscriptions']} subscriptions: "
              f"{m['mb']} MB ({m['bytes_per_subscription']} B/subscription); "
              f"after removing every client: {m['bytes_after_removing_all']} B")
    print("match() calls/s")
    for r in res["match"]:
        print(f"  with {r['other_subscriptions']:>7} non-matching subscriptions: "
              f"1 match {r['match_1_per_s']:>9}/s, 100 matches {r['match_100_per_s']:>7}/s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
