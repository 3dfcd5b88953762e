"""``bench edge``'s text report: msg/s per QoS for each capture log the edge
ran on and for Mosquitto, the PUBACK latencies (at full load and at a fixed
rate), each capture's ratio against the local log's and against Mosquitto's,
whether each log holds every acknowledged frame, and the issue's targets."""

from __future__ import annotations

__all__ = ["print_result"]

_QOS = ("qos0", "qos1", "qos2")


def _num(v, fmt: str = ",.0f", width: int = 12) -> str:
    return f"{v:>{width}{fmt}}" if isinstance(v, (int, float)) else f"{'-':>{width}}"


def print_result(r: dict) -> None:
    caps = r["captures"]
    ok = [c for c in caps if "error" not in caps[c]]
    servers = ok + (["mosquitto"] if "mosquitto" in r else [])
    meas = {**{c: caps[c] for c in ok}, **({"mosquitto": r["mosquitto"]} if "mosquitto" in r else {})}
    print(f"edge vs mosquitto: {r['connections']} connections, MQTT {r['protocol']}, "
          f"{r['payload_bytes']}-byte payloads, window {r['window']}, {r['cpus']} CPUs, "
          f"median of {r['repeat']} runs")
    for c, v in caps.items():
        print(f"  edge on {c:7} {v['description']}" + (f"  FAILED: {v['error']}" if "error" in v else ""))
    if not servers:
        return
    head = "".join(f"{s:>12}" for s in servers)
    print(f"{'msg/s':10}{head}")
    for q in _QOS:
        print(f"{q:10}" + "".join(_num(meas[s][q]["msgs_per_s"]) for s in servers))
    print(f"{'PUBACK ms':10}{head}   (QoS 1 at full load, window {r['window']})")
    for k in ("p50", "p99"):
        print(f"{k:10}" + "".join(_num((meas[s]["qos1"].get("puback_latency_ms") or {}).get(k), ".2f")
                                  for s in servers))
    if any(meas[s].get("latency") for s in servers):
        lr = next(meas[s]["latency"] for s in servers if meas[s].get("latency"))
        print(f"{'PUBACK ms':10}{head}   (QoS 1 at a fixed {lr['rate']:,.0f} msg/s for {lr['seconds']:g} s)")
        for k in ("p50", "p99", "max"):
            print(f"{k:10}" + "".join(_num(((meas[s].get("latency") or {}).get("puback_latency_ms") or {}).get(k),
                                           ".2f") for s in servers))
    for base, key in (("local", "ratio_to_local"), ("mosquitto", "ratio_to_mosquitto")):
        cols = [c for c in ok if caps[c].get(key) and c != base]
        if not cols:
            continue
        print(f"{'ratio to ' + base:20}" + "".join(f"{c:>10}" for c in cols))
        for q in _QOS:
            print(f"{q:20}" + "".join(_num(caps[c][key][q], ".2f", 10) for c in cols))
    for c in ok:
        cap = caps[c]["capture"]
        print(f"edge on {c}: the log holds {cap['publish']:,} PUBLISH records for "
              f"{cap['acknowledged_publish']:,} acknowledged/accepted messages"
              + ("" if cap["all_acknowledged_captured"] else "  (MISSING RECORDS)"))
    t = r.get("targets")
    if t:
        print("targets (issue 42, the edge on the one-node Kafka):")
        names = {"kafka_qos1_ratio_to_local": "QoS 1 msg/s, ratio to the local log's",
                 "kafka_puback_p99_ms_at_rate": "PUBACK p99 (ms) at the fixed rate"}
        for k, v in t.items():
            verdict = "not measured" if v["met"] is None else ("met" if v["met"] else "MISSED")
            value = "-" if v["value"] is None else f"{v['value']:g}"
            print(f"  {names[k]:40} {v['target']:>8}: {value:>8}  {verdict}")
