"""Planning N = M samples: samplerd's CPU backend vs torch.utils.data.WeightedRandomSampler,
measured in the same run on the same machine, with the ratio.

    python3 bench/compare_torch.py [--n 10000000]        (Debian's python3-torch is enough)

The samplerd figures come from //bench:plan_timer (median of 5 plans, all cores, plus the peak
memory the planning added beyond its weights and the plan). WeightedRandomSampler is timed as a
trainer uses it: list(iter(sampler)), median of 3.
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


def time_torch(n, replacement, repeats=3):
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        indices = list(iter(WeightedRandomSampler(weights, n, replacement=replacement)))
        times.append(time.perf_counter() - start)
        assert len(indices) == n
    return statistics.median(times)


def time_samplerd(n, replacement):
    binary = os.path.join(ROOT, "bazel-bin", "bench", "plan_timer")
    if not os.access(binary, os.X_OK):
        subprocess.run(["bazel", "build", "//bench:plan_timer"], cwd=ROOT, check=True)
    out = subprocess.run([binary, f"--n={n}", f"--replacement={str(replacement).lower()}"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000_000)
    args = parser.parse_args()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if "model name" in l),
               platform.processor())
    print(f"machine: {os.cpu_count()} cores, {cpu}; torch {torch.__version__} "
          f"({torch.get_num_threads()} intra-op threads)")
    print(f"| mode (N = M = {args.n:.0e}) | WeightedRandomSampler | samplerd CPU | ratio | "
          f"samplerd extra memory |")
    print("|---|---|---|---|---|")
    for replacement in (True, False):
        t_torch = time_torch(args.n, replacement)
        ours = time_samplerd(args.n, replacement)
        mode = "with replacement" if replacement else "without replacement"
        print(f"| {mode} | {t_torch:.3f} s | {ours['median_s']:.3f} s | "
              f"{t_torch / ours['median_s']:.1f}x | {ours['extra_bytes_per_sample']:.1f} B/sample |")


if __name__ == "__main__":
    main()
