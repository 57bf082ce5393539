#!/usr/bin/env python3
"""Summarize an Nsight Compute source page (ncu -i REP --page source --csv --print-source ...) by stall samples.

usage: ncu_source.py PAGE.csv [TOP]

Finds the warp-stall-sampling column ("Warp Stall Sampling (All Samples)") and the instruction-count column
("Instructions Executed") of the CSV, prints their totals, then the TOP (default 60) rows with the most
samples: address / source text, samples, % of all, instructions executed. When the page carries CUDA
source lines (--print-source cuda,sass) they are summed per source line as well. Used by
scripts/device-check.sh (NCU_SOURCE=1) to say where a kernel's cycles go without shipping the report.
"""
import csv
import sys
from collections import defaultdict


def num(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    with open(sys.argv[1], newline="", errors="replace") as f:
        lines = [l for l in f if l.count(",") >= 2 or l.startswith('"')]
    rows = list(csv.reader(lines))
    hdr_i = next((i for i, r in enumerate(rows) if any("Stall Sampling" in c for c in r)), None)
    if hdr_i is None:
        print("no stall-sampling column; first lines:")
        for r in rows[:20]:
            print(",".join(r)[:200])
        return 1
    hdr = rows[hdr_i]
    col = lambda *keys: next((i for i, c in enumerate(hdr) if all(k in c for k in keys)), None)
    c_all = col("Stall Sampling", "All") or col("Stall Sampling")
    c_exe = col("Instructions Executed")
    c_src = col("Source")
    c_addr = col("Address")
    body = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
    tot = sum(num(r[c_all]) for r in body)
    tot_exe = sum(num(r[c_exe]) for r in body) if c_exe is not None else 0
    print(f"{len(body)} rows, {tot:.0f} stall samples, {tot_exe:.0f} warp instructions executed")
    by_src = defaultdict(float)
    for r in body:
        if c_src is not None:
            by_src[r[c_src].strip()[:100]] += num(r[c_all])
    ranked = sorted(body, key=lambda r: -num(r[c_all]))[:top]
    print("| addr | source | samples | % | executed |")
    for r in ranked:
        s = num(r[c_all])
        print(f"| {r[c_addr] if c_addr is not None else ''} | {r[c_src].strip()[:90] if c_src is not None else ''} | {s:.0f} | "
              f"{100 * s / max(tot, 1):.1f} | {num(r[c_exe]) if c_exe is not None else 0:.0f} |")
    if c_exe is not None:
        print("\nmost executed:")
        for r in sorted(body, key=lambda r: -num(r[c_exe]))[:25]:
            print(f"| {r[c_addr] if c_addr is not None else ''} | {r[c_src].strip()[:90] if c_src is not None else ''} | {num(r[c_exe]):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
