"""``bench e2e``'s report: the ratios lakegate / glue and the table printed
without ``--json``."""

from __future__ import annotations

from typing import Any, Callable

def compare(out: dict) -> None:
    lg, gl = out.get("lakegate"), out.get("glue")
    if "lakegate" in out and "latency" in lg and "ack_after_forward" in lg:
        cap, fwd = lg["latency"].get("puback_ms"), lg["ack_after_forward"].get("puback_ms")
        if cap and fwd:
            out["ack_modes"] = {"rate": out["offered_rate"], "capture_puback_ms": cap, "forward_puback_ms": fwd,
                                "difference_ms": {q: round(fwd[q] - cap[q], 2) for q in ("p50", "p99")}}
    if not (lg and gl):
        return
    ratio: dict[str, float | None] = {}
    le, ge = (lg.get("latency") or {}).get("e2e_ms"), (gl.get("latency") or {}).get("e2e_ms")
    if le and ge:
        for q in ("p50", "p95", "p99"):
            ratio[f"e2e_{q}_lakegate_to_glue"] = round(le[q] / ge[q], 2) if ge[q] else None
    lr = (lg.get("sustained") or {}).get("max_sustained_rate")
    gr = (gl.get("sustained") or {}).get("max_sustained_rate")
    ratio["sustained_rate_lakegate_to_glue"] = round(lr / gr, 2) if lr and gr else None
    out["ratios"] = ratio


def _fmt_lat(d: dict | None, qs=("p50", "p95", "p99")) -> str:
    return " / ".join(f"{d[q]:,.1f}" for q in qs) if d else "-"


def _last_held(side: dict, key: str) -> Any:
    held = [st for st in side["sustained"]["steps"] if st["sustained"]]
    return held[-1][key] if held else None


def print_table(r: dict) -> None:
    print(f"bench e2e ({r['date']}, {r['cpus']} CPUs, load {r['loadavg_start'][0]}): MQTT {r['protocol']} QoS 1, "
          f"{r['connections']} connections, {r['payload_bytes']}-byte payloads, offered {r['offered_rate']} msg/s")
    sides = [s for s in ("lakegate", "glue") if s in r]
    w = 22
    print(f"{'':38}" + "".join(f"{s:>{w}}" for s in sides))

    def row(name: str, get: Callable[[dict], str]) -> None:
        vals = []
        for s in sides:
            try:
                vals.append(get(r[s]))
            except (KeyError, TypeError):
                vals.append("-")
        print(f"{name:38}" + "".join(f"{v:>{w}}" for v in vals))

    row("publish->AMQP p50/p95/p99 (ms)", lambda d: _fmt_lat(d["latency"]["e2e_ms"]))
    row("publish->messages p50/p95/p99 (ms)",
        lambda d: " / ".join(f"{d['latency']['table']['table_ms'][q]:,.0f}" for q in ("p50", "p95", "p99")))
    row("PUBACK p50/p99 (ms)", lambda d: _fmt_lat(d["latency"]["puback_ms"], ("p50", "p99")))
    row("received / acknowledged", lambda d: f"{d['latency']['received']} / {d['latency']['acknowledged']}")
    row("highest sustained rate (msg/s)",
        lambda d: f"{d['sustained']['max_sustained_rate'] or 0:,.0f}"
        + (f" (<{d['sustained']['lowest_failed_rate']:,.0f})" if d["sustained"]["lowest_failed_rate"] else ""))
    row("job rows/s while busy, last step held", lambda d: f"{_last_held(d, 'job_rows_per_busy_s'):,.0f}")
    row("  forwarding off (msg/s)",
        lambda d: f"{d['sustained_forwarding_off']['max_sustained_rate'] or 0:,.0f}"
        + (f" (<{d['sustained_forwarding_off']['lowest_failed_rate']:,.0f})"
           if d["sustained_forwarding_off"]["lowest_failed_rate"] else ""))
    row("  bare proton sender, same peer (msg/s)", lambda d: f"{d['bare_proton']['msgs_per_s']:,.0f}")
    row("  at the bare sender's rate", lambda d: f"{d['at_bare_rate']['rate']:,.0f}: "
        + ("holds" if d["at_bare_rate"]["holds"] else "does not hold"))
    row("CPU s per 1,000 msgs, latency phase", lambda d: f"{d['latency']['cpu_s_per_1000_msgs']}")
    row("CPU with no traffic (% of a core)", lambda d: f"{d['idle_cpu_pct_of_core']}")
    row("start: edge / query / 1st batch (s)",
        lambda d: f"{d['edge_up_s']} / {d['job_started_s']} / {d['job_ready_s']}")
    for key, what in (("kill", "kill"), ("kill_overload", "kill overloaded")):
        if not any(key in r[s] for s in sides):
            continue
        rate = next(r[s][key]["offered_rate"] for s in sides if key in r[s])
        row(f"{what} at {rate:,.0f}/s: acked / lost / dup",
            lambda d, k=key: f"{d[k]['acknowledged']} / {d[k]['lost_acknowledged']} / {d[k]['duplicates']}")
        row(f"{what}: restart (s)", lambda d, k=key: f"{d[k]['restart_s']}")
    for s in [*sides, "forwarding off"]:
        d = r["lakegate"].get("sustained_forwarding_off") if s == "forwarding off" and "lakegate" in r else \
            r.get(s, {}).get("sustained")
        steps = d["steps"] if d else []
        if not steps:
            continue
        print(f"{s} steps: " + ", ".join(
            f"{st['offered_rate']:,.0f} {'ok' if st['sustained'] else 'no'} (slope {st['backlog_slope_per_s']}/s)"
            for st in steps))
    if "lakegate" in r:
        c = r["lakegate"]["config"]
        print(f"lakegate config: {c['partitions']} partitions, maxRecordsPerTrigger {c['max_records_per_trigger']}, "
              f"trigger {c['trigger_interval_s']} s, {c['spark_master']} on {c['cores']} cores, "
              f"fsync {c['fsync_interval_ms']} ms, tables {c.get('tables_engine_used') or c['tables_engine']}")
    if "glue" in r:
        print(f"glue: {r['glue']['config']['forwarder']}")
    if "ack_modes" in r:
        a = r["ack_modes"]
        print(f"PUBACK at {a['rate']} msg/s: ack_after=capture p50 {a['capture_puback_ms']['p50']:.1f} ms, "
              f"p99 {a['capture_puback_ms']['p99']:.1f} ms; ack_after=forward p50 "
              f"{a['forward_puback_ms']['p50']:.1f} ms, p99 {a['forward_puback_ms']['p99']:.1f} ms")
    if "ratios" in r:
        print("ratios lakegate/glue: " + ", ".join(f"{k} {v}" for k, v in r["ratios"].items()))
    print(f"{r['seconds']} s; {r['consumer_queue']}")
