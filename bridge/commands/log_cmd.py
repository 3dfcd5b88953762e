"""``lakegate log stats|dump``: look into the capture log (read-only, safe while the edge runs).

``stats`` lists partitions with first and next offsets, record counts, bytes
on disk, segments and each consumer's committed offset. ``dump`` prints
records: ids, headers and sizes; the payload bytes (hex) only with
``--payload``. Both read only durable records.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from bridge.cli import UsageError, common_parser
from bridge.config import Config

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    stats = sub.add_parser("stats", parents=[common_parser()],
                           help="partitions: first and next offsets, records, bytes, consumers' commits")
    stats.add_argument("--format", choices=("text", "json"), default="text")
    stats.add_argument("--dir", metavar="DIR", help="capture log directory (default: data_dir/capture)")
    dump = sub.add_parser("dump", parents=[common_parser()],
                          help="print records: headers and sizes (payload bytes only with --payload)")
    dump.add_argument("--partition", "-p", type=int, action="append", metavar="N",
                      help="only this partition (repeatable; default: all)")
    dump.add_argument("--from", dest="start", type=int, metavar="OFFSET",
                      help="first offset (default: the partition's earliest)")
    dump.add_argument("--count", "-n", type=int, metavar="N", help="at most N records per partition")
    dump.add_argument("--payload", action="store_true", help="also print each frame's bytes (hex)")
    dump.add_argument("--format", choices=("text", "json"), default="text", help="json: one object per line")
    dump.add_argument("--dir", metavar="DIR", help="capture log directory (default: data_dir/capture)")


def _reader(args: argparse.Namespace, config: Config):
    from bridge.capture import LogReader
    from bridge.capture.errors import LogFormatError

    root = Path(args.dir).expanduser().resolve() if args.dir else config.capture_dir
    try:
        return LogReader(root)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    except LogFormatError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace, config: Config) -> int:
    reader = _reader(args, config)
    try:
        if args.action == "stats":
            return _stats(reader, args.format)
        return _dump(reader, args)
    except BrokenPipeError:  # `lakegate log dump | head`
        sys.stderr.close()
        return 0


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _stats(reader, fmt: str) -> int:
    parts = reader.stats()
    total_records = sum(s.records for s in parts)
    total_bytes = sum(s.bytes for s in parts)
    if fmt == "json":
        print(json.dumps({
            "path": str(reader.root),
            "stream": reader.stream,
            "format": reader.format,
            "partitions": [
                {"partition": s.partition, "first_offset": s.first_offset, "next_offset": s.next_offset,
                 "records": s.records, "bytes": s.bytes, "segments": s.segments, "committed": s.committed}
                for s in parts
            ],
            "records": total_records,
            "bytes": total_bytes,
        }, indent=2))
        return 0
    print(f"capture log {reader.root}: stream {reader.stream}, {reader.partitions} partitions, format {reader.format}")
    rows = [("partition", "first", "next", "records", "bytes", "segments", "committed")]
    for s in parts:
        committed = " ".join(f"{c}={o}" for c, o in sorted(s.committed.items())) or "-"
        rows.append((str(s.partition), str(s.first_offset), str(s.next_offset), str(s.records),
                     _human(s.bytes), str(s.segments), committed))
    rows.append(("total", "", "", str(total_records), _human(total_bytes), str(sum(s.segments for s in parts)), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:-1], widths[1:-1])] + [r[-1]]
        print("  ".join(cells).rstrip())
    return 0


def _text(b: bytes) -> str:
    """An id or header value for display: UTF-8 text when it is, else hex."""
    try:
        t = b.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + b.hex()
    return t if t.isprintable() else json.dumps(t)


def _ts(us: int) -> str:
    return dt.datetime.fromtimestamp(us / 1e6, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _dump(reader, args: argparse.Namespace) -> int:
    from bridge.capture.errors import CaptureError

    parts = args.partition or list(range(reader.partitions))
    for p in parts:
        if not 0 <= p < reader.partitions:
            raise UsageError(f"--partition {p}: the log has partitions 0-{reader.partitions - 1}")
    earliest = reader.earliest_offsets()
    durable = reader.durable_offsets()
    for p in parts:
        start = earliest[p] if args.start is None else args.start
        end = durable[p] if args.count is None else min(durable[p], start + max(args.count, 0))
        try:
            for r in reader.records(p, start, end):
                if args.format == "json":
                    row = {"partition": p, "offset": r.offset, "seq": r.seq, "timestamp": _ts(r.timestamp_us),
                           "key": _text(r.key), "value_bytes": len(r.value),
                           "headers": [[k, _text(v)] for k, v in r.stored_headers]}
                    if args.payload:
                        row["value_hex"] = r.value.hex()
                    print(json.dumps(row))
                else:
                    hdrs = " ".join(f"{k}={_text(v)}" for k, v in r.stored_headers)
                    print(f"partition={p} offset={r.offset} seq={r.seq} timestamp={_ts(r.timestamp_us)} "
                          f"key={_text(r.key)} value_bytes={len(r.value)} {hdrs}".rstrip())
                    if args.payload:
                        print(f"  value={r.value.hex()}")
        except CaptureError as exc:
            print(f"lakegate: {exc}", file=sys.stderr)
            return 1
    return 0
