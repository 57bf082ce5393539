#!/usr/bin/env python3
"""Sum an Nsight Compute CSV log (ncu --csv --print-units base --metrics ...) per kernel name.

usage: ncu_sum.py LOG.csv [LAST_N]

Keeps the last LAST_N launches (all when omitted), groups them by kernel name (namespaces dropped,
template arguments kept: they tell the weight types apart) and prints one markdown row per name:
launches, GPU µs in total and per token (tokens = launches of the argmax kernel in the window, one per
decode step), mean µs per launch, DRAM bytes read per launch and the achieved DRAM GB/s, grid, block,
registers and the active-warp percentage. Used by scripts/device-check.sh (NCU=1).
"""
import csv
import re
import sys
from collections import OrderedDict, defaultdict


def short(name):
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    name = re.sub(r"\bpg::cuda::", "", name)
    name = re.sub(r"\bpg::", "", name)
    name = re.sub(r"\(.*\)$", "", name)  # the parameter list
    name = name.replace("void ", "")
    return name[:110]


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prefixes its own messages with ==PROF==
    launches = OrderedDict()
    for r in csv.DictReader(lines):
        i = r.get("ID")
        if i is None:
            continue
        k = launches.setdefault(i, {"name": short(r.get("Kernel Name", "?")), "grid": r.get("Grid Size", ""), "block": r.get("Block Size", "")})
        try:
            k[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            pass
    ids = list(launches)
    if len(sys.argv) > 2:
        ids = ids[-int(sys.argv[2]):]
    if not ids:
        print("no kernel launches in the log")
        return 1
    agg = defaultdict(lambda: defaultdict(float))
    tokens = 0
    total = 0.0
    for i in ids:
        k = launches[i]
        a = agg[k["name"]]
        t = k.get("gpu__time_duration.sum", 0.0) * 1e-3  # ns -> µs
        a["n"] += 1
        a["us"] += t
        a["rd"] += k.get("dram__bytes_read.sum", 0.0)
        a["wr"] += k.get("dram__bytes_write.sum", 0.0)
        a["warps"] += k.get("sm__warps_active.avg.pct_of_peak_sustained_active", 0.0)
        a["regs"] = k.get("launch__registers_per_thread", 0.0)
        a["grid"] = k.get("launch__grid_size", 0.0)
        a["block"] = k.get("launch__block_size", 0.0)
        total += t
        if "argmax" in k["name"]:
            tokens += 1
    per = max(tokens, 1)
    print(f"{len(ids)} launches, {total:.1f} µs of GPU time, {tokens} decode steps (argmax launches): {total / per:.1f} µs per step")
    print("| kernel | launches/step | µs/step | % | µs/launch | DRAM MB read/launch | GB/s | grid | block | regs | warps active % |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, a in sorted(agg.items(), key=lambda kv: -kv[1]["us"]):
        n = a["n"]
        us = a["us"] / n
        gbs = (a["rd"] + a["wr"]) / n / (us * 1e-6) / 1e9 if us > 0 else 0.0
        print(f"| {name} | {n / per:.1f} | {a['us'] / per:.1f} | {100 * a['us'] / total:.1f} | {us:.2f} | {a['rd'] / n / 1e6:.2f} | {gbs:.0f} | "
              f"{a['grid']:.0f} | {a['block']:.0f} | {a['regs']:.0f} | {a['warps'] / n:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
