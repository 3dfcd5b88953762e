"""``lakegate status``: the job's last batch, the failure going on now, and its lag now.

Reads the last progress line the running job wrote (``data_dir/job-status.json``)
and computes the lag again from the checkpoint's last committed batch and
the capture log's durable end offsets, so it is current even between batches.
A failure -- the query failed and is being restarted, the executors'
forwarders are retrying (``bridge.amqp.trouble``) or the live forwarder
(``bridge.amqp.live``) is -- is shown first, with
its cause and since when (``bridge.job.progress.current_failure``).
With live forwarding, one more line: what it forwarded and how many
durable records it has not passed yet. In a cluster (``cluster.edges`` >
1), a line per edge from its last beat in the shared topic: alive or dead,
its connections, how far behind the other edges' partitions it is. Exit code 0 when a job has committed at least one batch, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from bridge.config import Config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("text", "json"), default="text")


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.capture import LogReader
    from bridge.job.pipeline import checkpoint_path
    from bridge.job.progress import (committed_offsets, current_failure, format_failure, format_line, lag,
                                     read_status)

    last = read_status(config.data_path)
    failure = current_failure(config.data_path, last)
    batch, end = committed_offsets(checkpoint_path(config))
    log_end: dict[str, int] = {}
    if config.capture.backend == "kafka":
        from bridge.capture import durable_ends
        from bridge.capture.errors import CaptureError

        try:
            log_end = {str(p): n for p, n in enumerate(durable_ends(config))}
        except CaptureError as exc:  # Kafka not answering: said, and the rest of the status still shown
            print(f"lakegate status: {exc}", file=sys.stderr)
    elif (config.capture_dir / "meta.json").exists():
        log_end = {str(p): n for p, n in enumerate(LogReader(config.capture_dir).durable_offsets())}
    now_lag = lag(end, log_end) if log_end else None
    live = _live(config, log_end)
    cluster = _cluster(config)
    out = {
        "checkpoint": str(checkpoint_path(config)),
        "committed_batch": batch,
        "committed_offsets": end,
        "log_end_offsets": log_end,
        "lag": now_lag,
        "last_batch": {k: v for k, v in last.items() if k != "failure"} if last and "batch_id" in last else None,
        "failure": failure,
        "live_forwarding": live,
        "cluster": cluster,
    }
    if args.format == "json":
        print(json.dumps(out))
    else:
        if failure:
            print(format_failure(failure))
        if last and "batch_id" in last:
            age = dt.datetime.now().timestamp() - last.get("time", 0)
            print(f"last batch ({age:.0f}s ago): {format_line(last)}")
        else:
            print("no batch reported yet (is the job running? lakegate process / lakegate run)")
        print(f"checkpoint: {out['checkpoint']}, committed batch: {batch if batch is not None else 'none'}")
        if live is not None:
            print(f"forwarding live: {live['forwarded']} forwarded, {live['expired']} expired, "
                  f"{live['unforwardable']} quarantined since start; {live['behind']} records not forwarded yet")
        if cluster is not None:
            for e, m in sorted(cluster["members"].items()):
                if m is None:
                    print(f"cluster edge {e}: no beat found")
                    continue
                info = m["info"]
                print(f"cluster edge {e}: {'alive' if m['alive'] else 'DEAD'} (last beat {m['beat_age_s']:.1f} s ago), "
                      f"{info.get('connections', '?')} connections, {info.get('lag', '?')} records behind the "
                      f"others, at {info.get('host', '?')}:{info.get('port', '?')}")
        if now_lag is None:
            print("lag now: unknown (no capture log)")
        else:
            print(f"lag now: {now_lag} records (log end {log_end}, committed {end or {}})")
    return 0 if batch is not None else 1


def _live(config: Config, log_end: dict[str, int]) -> dict | None:
    """The live forwarder's counts and, now, how many durable records it has
    not passed yet (log end minus its forwarded marks); None when none runs."""
    from bridge.amqp.forwarded import ForwardedOffsets
    from bridge.amqp.live import read_live_status

    st = read_live_status(config.data_path)
    if st is None:
        return None
    behind = ForwardedOffsets(config.data_path, config.capture_stream).behind(log_end)
    return {**{k: st.get(k, 0) for k in ("forwarded", "expired", "unforwardable", "records", "cycles")},
            "behind": behind, "time": st.get("time")}


def _cluster(config: Config) -> dict | None:
    """A cluster's members as their last beats in the shared topic say
    (``cluster.edges`` > 1), else None."""
    if config.cluster.edges <= 1 or config.capture.backend != "kafka":
        return None
    import time

    from bridge.capture.errors import CaptureError
    from bridge.capture.kafka_tail import last_beats

    try:
        beats = last_beats(config)
    except CaptureError as exc:
        print(f"lakegate status: cluster members not read: {exc}", file=sys.stderr)
        return None
    now = time.time()
    members = {}
    for e in range(config.cluster.edges):
        b = beats.get(e)
        members[e] = None if b is None else {
            "alive": now - b["seen"] <= config.cluster.lease_s, "beat_age_s": round(now - b["seen"], 3),
            "info": b["info"]}
    return {"edges": config.cluster.edges, "lease_s": config.cluster.lease_s, "members": members}
