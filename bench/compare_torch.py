"""Planning an epoch of N samples: samplerd's CPU backend vs torch.utils.data.WeightedRandomSampler,
measured in the same run on the same machine, with the ratio.

    python3 bench/compare_torch.py [--n 10000000] [--torch-repeats 3] [--repeats 5]

(Debian's /usr/bin/python3 with python3-torch is enough; the script builds //bench:plan_timer.)

Anchor: WeightedRandomSampler timed as a trainer uses it, list(iter(sampler)) (median of
--torch-repeats); internally that is one torch.multinomial(weights, N, replacement) plus the
conversion to a Python list, so the bare torch.multinomial call is timed too and printed as a
stricter second anchor. torch runs with torch.set_num_threads(all cores) (its CPU multinomial is
single-threaded either way). samplerd: //bench:plan_timer, median of --repeats plans on all
cores, plus the peak memory the planning added beyond its input weights and the plan itself.
Both use N random weights U(0.1, 1.1).

Rows: M = N with and without replacement (the issue's targets), and M = N/10 without
replacement. With M = N and no replacement every sample appears once, so samplerd's plan is a
uniform shuffle while torch still draws a weight-ordered permutation; the M = N/10 row compares
weighted selection with weighted selection, and torch.randperm(N) is printed as the anchor for a
plain shuffle.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import torch
from torch.utils.data import WeightedRandomSampler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def time_torch(n, m, replacement, repeats):
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    sampler_s, multinomial_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        indices = list(iter(WeightedRandomSampler(weights, m, replacement=replacement)))
        sampler_s.append(time.perf_counter() - start)
        assert len(indices) == m
        del indices
        start = time.perf_counter()
        drawn = torch.multinomial(weights, m, replacement)
        multinomial_s.append(time.perf_counter() - start)
        assert drawn.numel() == m
    return statistics.median(sampler_s), statistics.median(multinomial_s)


def time_randperm(n, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        perm = torch.randperm(n)
        times.append(time.perf_counter() - start)
        assert perm.numel() == n
    return statistics.median(times)


def time_samplerd(binary, n, m, replacement, repeats):
    out = subprocess.run([binary, f"--n={n}", f"--m={m}",
                          f"--replacement={str(replacement).lower()}", f"--repeats={repeats}"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=5, help="samplerd plans per mode")
    parser.add_argument("--torch-repeats", type=int, default=3, help="torch runs per mode")
    args = parser.parse_args()
    build = subprocess.run(["bazel", "build", "-c", "opt", "//bench:plan_timer"], cwd=ROOT,
                           capture_output=True, text=True)
    if build.returncode != 0:
        raise SystemExit(f"bazel build //bench:plan_timer failed:\n{build.stderr}")
    binary = os.path.join(ROOT, "bazel-bin", "bench", "plan_timer")
    torch.set_num_threads(os.cpu_count())
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if "model name" in l),
               platform.processor())
    print(f"machine: {os.cpu_count()} cores, {cpu}; torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)")
    print(f"| mode (N = {args.n:.0e}) | WeightedRandomSampler, list(iter(.)) | "
          f"torch.multinomial alone | samplerd CPU | ratio vs WRS | ratio vs multinomial | "
          f"samplerd extra memory |")
    print("|---|---|---|---|---|---|---|")
    n = args.n
    for m, replacement in ((n, True), (n, False), (n // 10, False)):
        t_sampler, t_multinomial = time_torch(n, m, replacement, args.torch_repeats)
        ours = time_samplerd(binary, n, m, replacement, args.repeats)
        t_ours = ours["median_s"]
        mode = (("with" if replacement else "without") + " replacement, M = " +
                ("N" if m == n else "N/10"))
        print(f"| {mode} | {t_sampler:.3f} s | {t_multinomial:.3f} s | {t_ours:.3f} s | "
              f"{t_sampler / t_ours:.1f}x | {t_multinomial / t_ours:.1f}x | "
              f"{ours['extra_bytes_per_sample']:.1f} B/sample |", flush=True)
    t_perm = time_randperm(n, args.torch_repeats)
    ours = time_samplerd(binary, n, n, False, args.repeats)
    print(f"plain shuffle anchor: torch.randperm({n:.0e}) {t_perm:.3f} s; samplerd's M = N plan "
          f"without replacement {ours['median_s']:.3f} s ({t_perm / ours['median_s']:.1f}x)")

if __name__ == "__main__":
    main()
