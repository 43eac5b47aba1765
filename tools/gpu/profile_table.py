#!/usr/bin/env python3
"""Where the time of a benchmarked operation goes: one line per kernel, from ncu's raw CSV.

tools/gpu/check.sh (step 4.3) runs, for each operation that misses its target,
    ncu --csv --page raw --print-units base --metrics <METRICS> --log-file ncu_<op>.csv \\
        gpu_benchmark --sizes=N --reps=1 --ops=<op>
(gpu_benchmark runs the operation twice then: a warm-up and one timed run) and this script
prints, per operation, each kernel's time per run of the operation, its share, the DRAM bytes it
moved and at what rate, its registers and occupancy, and its SM and memory throughput as a
percentage of the GPU's peak. Kernels launched fewer times than the operation ran (the
benchmark's set-up: Fill*, another operation's table) are left out.

    profile_table.py [--runs=2] [--copy_gbps=X] ncu_<op>.csv...

--copy_gbps: the device-to-device copy's rate (bytes read + written) from the same run, for the
column "copy%" (a kernel's DRAM rate against it); omitted: no such column.
"""
import argparse
import csv
import os
import re
import sys
from collections import OrderedDict

# The metrics check.sh asks ncu for (one home: check.sh reads this list with --print_metrics).
METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "launch__registers_per_thread",
    "launch__block_size",
    "launch__grid_size",
    "sm__maximum_warps_per_active_cycle_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
]


def number(text):
    """A CSV cell as a float (ncu may print thousands separators); None if it is not one."""
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def short_name(name):
    """'void samplerd::gpu::(anonymous namespace)::FineSplitKernel<unsigned int>(...)' ->
    'FineSplitKernel<unsigned int>'."""
    name = re.sub(r"^void ", "", name.strip())
    depth, cut = 0, len(name)
    for k, c in enumerate(name):  # The parameter list: the first '(' outside template brackets.
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and not name.startswith("(anonymous", k):
            cut = k
            break
    name = name[:cut]
    name = re.sub(r"(\w+::|\(anonymous namespace\)::|<unnamed>::)+(?=\w)", "", name)
    return name[:40]


def read_rows(path):
    """The kernel rows of one ncu raw CSV (its log file: ==PROF== lines, then the table)."""
    with open(path, newline="", errors="replace") as f:
        lines = [line for line in f if not line.startswith("==")]
    start = next((k for k, line in enumerate(lines) if '"Kernel Name"' in line), None)
    if start is None:
        return []
    reader = csv.DictReader(lines[start:])
    rows = []
    for row in reader:
        if row.get("ID", "") == "" or number(row.get("ID")) is None:
            continue  # The units row.
        rows.append(row)
    return rows


def table(path, runs, copy_gbps):
    op = re.sub(r"^ncu_|\.csv$", "", os.path.basename(path))
    rows = read_rows(path)
    if not rows:
        return [f"{op}: no kernel rows in {os.path.basename(path)} (ncu's log: see the file)"]
    kernels = OrderedDict()
    for row in rows:
        name = short_name(row.get("Kernel Name", "?"))
        k = kernels.setdefault(name, {"launches": 0, "ns": 0.0, "bytes": 0.0, "rows": []})
        k["launches"] += 1
        k["ns"] += number(row.get("gpu__time_duration.sum")) or 0.0
        k["bytes"] += (number(row.get("dram__bytes_read.sum")) or 0.0) + (
            number(row.get("dram__bytes_write.sum")) or 0.0)
        k["rows"].append(row)
    # The benchmark's set-up (Fill*, the table of another operation...) runs once, not in every
    # run of the operation: left out.
    setup = [name for name, k in kernels.items() if k["launches"] < runs]
    for name in setup:
        del kernels[name]
    total_ns = sum(k["ns"] for k in kernels.values()) or 1.0
    out = [f"{op}: {total_ns / runs / 1e6:.3f} ms of kernels per run ({runs} runs profiled)"]
    head = (f"  {'kernel':<40} {'calls':>5} {'ms':>8} {'share':>6} {'GB':>7} {'GB/s':>6}"
            + (f" {'copy%':>5}" if copy_gbps else "")
            + f" {'regs':>4} {'occ.th':>6} {'occ':>5} {'sm%':>5} {'mem%':>5}")
    out.append(head)
    if setup:
        out.append(f"  (set-up left out: {', '.join(setup)})")
    for name, k in sorted(kernels.items(), key=lambda item: -item[1]["ns"]):
        last = k["rows"][-1]
        gbps = k["bytes"] / k["ns"] if k["ns"] else 0.0  # bytes per ns = GB/s

        def mean(metric):
            values = [number(r.get(metric)) for r in k["rows"]]
            values = [v for v in values if v is not None]
            return sum(values) / len(values) if values else float("nan")

        line = (f"  {name:<40} {k['launches'] // runs:>5} {k['ns'] / runs / 1e6:>8.3f}"
                f" {100 * k['ns'] / total_ns:>5.1f}% {k['bytes'] / runs / 1e9:>7.2f} {gbps:>6.0f}")
        if copy_gbps:
            line += f" {100 * gbps / copy_gbps:>5.0f}"
        line += (f" {number(last.get('launch__registers_per_thread')) or 0:>4.0f}"
                 f" {mean('sm__maximum_warps_per_active_cycle_pct'):>6.1f}"
                 f" {mean('sm__warps_active.avg.pct_of_peak_sustained_active'):>5.1f}"
                 f" {mean('sm__throughput.avg.pct_of_peak_sustained_elapsed'):>5.1f}"
                 f" {mean('gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed'):>5.1f}")
        out.append(line)
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of the operation profiled")
    parser.add_argument("--copy_gbps", type=float, default=0.0)
    parser.add_argument("--print_metrics", action="store_true",
                        help="print the metrics to ask ncu for (comma-separated) and exit")
    parser.add_argument("csv", nargs="*")
    args = parser.parse_args(argv)
    if args.print_metrics:
        print(",".join(METRICS))
        return 0
    print("where the time goes (ncu, one line per kernel; ms and GB per run of the operation;"
          " occ.th/occ: theoretical/achieved occupancy %; sm%/mem%: of the GPU's peak)")
    for path in args.csv:
        for line in table(path, max(args.runs, 1), args.copy_gbps):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
