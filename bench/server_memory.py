"""Server memory per sample, measured through the real samplerd binary.

    python3 bench/server_memory.py [--sizes 10000000 80000000]

For each N, a fresh samplerd runs one job (loss policy, 2 ranks) to its steady state: every sample
reported in epoch 0, the epoch closed, epoch 1 planned (and epoch 2 planned ahead). The resident
memory growth over the idle server is read from /proc. The slope between two sizes is the cost
per sample; the intercept is the fixed cost (gRPC buffers and the like), which is not per sample.
The fixed part varies by some tens of MiB between runs (per-thread malloc arenas), so the sizes
are far apart (1e7 and 8e7 by default: 1.6 GB at the larger): 30 MiB of noise moves the slope by
less than half a byte.
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import samplerd  # noqa: E402


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def steady_state_growth(binary, n):
    proc = subprocess.Popen([binary, "--plaintext", "--port=0", "--log_level=1",
                             f"--max_samples_per_job={max(n, 1 << 32)}"],
                            stdout=subprocess.PIPE, text=True)
    try:
        address = proc.stdout.readline().split()[-1]
        idle = rss_bytes(proc.pid)
        with samplerd.Client(address, timeout=300) as c:
            c.create_job("mem", num_samples=n, world_size=2, loss="loss")
            for rank in range(2):
                shard = c.read_shard("mem", 0, rank, 2)
                for start in range(0, shard.size, 1 << 20):
                    end = min(shard.size, start + (1 << 20))
                    c.report_losses("mem", 0, rank, shard[start:end], np.full(end - start, 0.5),
                                    np.arange(start, end), seq=start)
            for rank in range(2):
                c.end_epoch("mem", 0, rank)
            while not c.get_job("mem").plan_ready:
                time.sleep(0.05)
            time.sleep(max(3.0, n / 4e6))  # The plan of epoch 2, computed ahead, is done.
            return rss_bytes(proc.pid) - idle
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs=2, default=[10_000_000, 80_000_000])
    parser.add_argument("--samplerd", default=os.path.join(ROOT, "bazel-bin", "server", "samplerd"))
    args = parser.parse_args()
    (n1, n2) = args.sizes
    g1, g2 = steady_state_growth(args.samplerd, n1), steady_state_growth(args.samplerd, n2)
    slope = (g2 - g1) / (n2 - n1)
    fixed = g1 - slope * n1
    plan = 4 if n2 <= 1 << 32 else 8
    print(f"| N | resident growth |\n|---|---|\n| {n1:.0e} | {g1 / 2**20:.0f} MiB |\n"
          f"| {n2:.0e} | {g2 / 2**20:.0f} MiB |")
    print(f"per sample: {slope:.2f} bytes, of which {plan} are the current plan: "
          f"{slope - plan:.2f} beyond it; fixed: {fixed / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
