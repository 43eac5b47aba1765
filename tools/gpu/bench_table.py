"""The table of tools/gpu/check.sh (stages 4 to 6): kernels against torch, and the issue's targets.

Reads the logs of a run: the "RESULT <op> <N> <M> <ms> <items/s> <GB/s> <copy fraction>" lines of
bench/gpu_benchmark.cu and bench/torch_anchors.py (same format, torch's ops prefixed "torch_"),
the "BOUNDARY ..." line of compare_backends --boundary_n, and loss_reporter_bench's device_cost
JSON line. A log that is missing or holds none of these adds nothing. Prints the benchmark's own
DEVICE, MEMORY and SKIP lines, one row per measurement (the torch anchor of the same N next to
the operation it stands for), then the targets at N = 1e9 with what was measured.

  python3 tools/gpu/bench_table.py --bench=bench.log --torch=torch.log \
      [--boundary=boundary.log] [--device_cost=loss_reporter_bench.log]
"""
import argparse
import json
import os
import re

# Our operation -> torch's anchor for it (bench/torch_anchors.py).
ANCHORS = {
    "no_replacement_M=N": "torch_exp_keys_sort_M=N",
    "no_replacement_M=N/10_weighted": "torch_exp_keys_topk_M=N/10",
    "replacement_M=N_weighted": "torch_cumsum_searchsorted_M=N",
}
# The targets at N = 1e9, in milliseconds (the kernel rows).
TARGETS_MS = {
    "no_replacement_M=N": 20.0,
    "no_replacement_M=N/10_weighted": 15.0,
    "replacement_M=N_weighted": 40.0,
    "recompute_loss": 8.0,
    "recompute_loss_base": 8.0,
}
TARGET_N = 10**9
BOUNDARY_TARGET_MS = 300.0
DEVICE_COST_TARGET_US = 10.0


def lines_of(path):
    if not path or not os.path.exists(path):
        return []
    with open(path, errors="replace") as f:
        return f.read().splitlines()


def read_results(paths):
    """(op, n) -> (ms, items/s, GB/s, fraction of the copy bandwidth); the notes, in order."""
    rows, notes = {}, []
    for path in paths:
        for line in lines_of(path):
            if line.startswith(("DEVICE", "MEMORY", "SKIP")):
                notes.append(line.rstrip())
            if line.startswith("RESULT "):
                parts = line.split()
                if len(parts) != 8:
                    notes.append(f"unreadable: {line.rstrip()}")
                    continue
                _, op, n, _m, ms, ips, gbps, frac = parts
                rows[(op, int(n))] = (float(ms), float(ips), float(gbps), float(frac))
    return rows, notes


def boundary_of(path):
    """(median ms, the line) of the last BOUNDARY line, or None."""
    found = None
    for line in lines_of(path):
        m = re.match(r"BOUNDARY .*\bn=(\d+)\b.*\bmedian_ms=([0-9.]+)", line)
        if m:
            found = (int(m.group(1)), float(m.group(2)), line.strip())
    return found


def device_cost_of(path):
    """loss_reporter_bench's device_cost record, or None."""
    for line in lines_of(path):
        if '"device_cost"' in line:
            try:
                return json.loads(line)
            except ValueError:
                return {"skipped": f"unreadable line: {line.strip()}"}
    return None


def verdict(value, target):
    return "met" if value <= target else "MISSED"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="")
    parser.add_argument("--torch", default="")
    parser.add_argument("--boundary", default="")
    parser.add_argument("--device_cost", default="")
    args = parser.parse_args()

    rows, notes = read_results([args.bench, args.torch])
    for note in notes:
        print(note)
    if rows:
        print(f"{'operation':38} {'N':>11} {'ms':>9} {'items/s':>9} {'GB/s':>7} {'copy%':>6} "
              f"{'torch ms':>9} {'x torch':>8} {'target':>7}")
    for (op, n), (ms, ips, gbps, frac) in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        anchor = rows.get((ANCHORS.get(op, ""), n))
        torch_ms = f"{anchor[0]:9.2f}" if anchor else f"{'-':>9}"
        speedup = f"{anchor[0] / ms:8.1f}" if anchor else f"{'-':>8}"
        target = f"{TARGETS_MS[op]:7.0f}" if op in TARGETS_MS and n == TARGET_N else f"{'':7}"
        print(f"{op:38} {n:11d} {ms:9.3f} {ips:9.3g} {gbps:7.0f} {100 * frac:6.0f} {torch_ms} "
              f"{speedup} {target}")

    print(f"\ntargets (N = {TARGET_N:.0e}):")
    for op, target in TARGETS_MS.items():
        got = rows.get((op, TARGET_N))
        status = f"{got[0]:.2f} ms, {verdict(got[0], target)}" if got else "not measured"
        print(f"  {op:38} <= {target:5.0f} ms: {status}")
    boundary = boundary_of(args.boundary)
    if boundary and boundary[0] == TARGET_N:
        status = f"{boundary[1]:.1f} ms, {verdict(boundary[1], BOUNDARY_TARGET_MS)}"
    elif boundary:
        status = f"not measured at N = 1e9 ({boundary[1]:.1f} ms at N = {boundary[0]})"
    else:
        status = "not measured"
    print(f"  {'epoch boundary, samplerd, M = N/10':38} <= {BOUNDARY_TARGET_MS:5.0f} ms: {status}")
    cost = device_cost_of(args.device_cost)
    if cost and "median_us" in cost:
        status = (f"{cost['median_us']:.2f} us median, {cost.get('p99_us', 0):.2f} us p99, "
                  f"{verdict(cost['median_us'], DEVICE_COST_TARGET_US)}")
    elif cost:
        status = f"not measured: {cost.get('skipped', '?')}"
    else:
        status = "not measured"
    print(f"  {'ReportFromDevice per step':38} <= {DEVICE_COST_TARGET_US:5.0f} us: {status}")


if __name__ == "__main__":
    main()
