#!/usr/bin/env python3
"""Rank the lines of an Nsight Compute source page by warp-stall samples and instructions executed.

usage: ncu_source.py PAGE.csv [TOP]

PAGE.csv is `ncu -i REP --page source --csv --print-source cuda,sass` (or `sass`). With cuda,sass the page
holds each CUDA source line (a row with a line number) followed by its SASS instructions (rows without one),
and each line's counts are the sums of its instructions' — so the totals are taken over one kind of row
only, never both. Prints the totals (stall samples, warp instructions executed), then the TOP (default 40)
CUDA lines by samples and by instructions executed, then the TOP SASS instructions by samples. Used by
scripts/device-check.sh (NCU_SOURCE=1) to say where a kernel's cycles go without shipping the report.
"""
import csv
import sys


def num(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return None


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(sys.argv[1], newline="", errors="replace") as f:
        rows = list(csv.reader(f))
    hdr = next((r for r in rows if any("Stall Sampling (All" in c for c in r)), None)
    if hdr is None:
        print("no stall-sampling column; first lines:")
        for r in rows[:20]:
            print(",".join(r)[:200])
        return 1
    col = lambda name: next((i for i, c in enumerate(hdr) if c.startswith(name)), None)
    c_line, c_samp, c_exe, c_addr = col("Line No"), col("Warp Stall Sampling (All"), col("Instructions Executed"), col("Address")
    # Source text: the first "Source" column is the CUDA line's, the one after "Address" the SASS text.
    c_cu = col("Source")
    c_sass = c_addr + 1 if c_addr is not None and c_addr + 1 < len(hdr) and hdr[c_addr + 1] == "Source" else c_cu
    # Data rows only: the page repeats its header block per source file of the function.
    body = [r for r in rows if len(r) == len(hdr) and num(r[c_samp]) is not None and num(r[c_exe]) is not None]
    cuda = [r for r in body if c_line is not None and r[c_line].strip()]
    sass = [r for r in body if c_line is None or not r[c_line].strip()]
    basis = sass if sass else cuda
    tot_s = sum(num(r[c_samp]) for r in basis)
    tot_e = sum(num(r[c_exe]) for r in basis)
    print(f"{len(cuda)} CUDA lines, {len(sass)} SASS instructions; {tot_s:.0f} stall samples, {tot_e:.0f} warp instructions executed")

    def table(title, rs, key, text):
        print(f"\n{title}\n| line / address | source | samples | % samples | executed | % executed |")
        for r in sorted(rs, key=lambda r: -num(r[key]))[:top]:
            s, e = num(r[c_samp]), num(r[c_exe])
            where = r[c_line] if rs is cuda else r[c_addr]
            print(f"| {where} | {r[text].strip()[:90]} | {s:.0f} | {100 * s / max(tot_s, 1):.1f} | {e:.0f} | {100 * e / max(tot_e, 1):.1f} |")

    if cuda:
        table("CUDA lines by stall samples:", cuda, c_samp, c_cu)
        table("CUDA lines by instructions executed:", cuda, c_exe, c_cu)
    if sass:
        table("SASS instructions by stall samples:", sass, c_samp, c_sass)
    return 0


if __name__ == "__main__":
    sys.exit(main())
