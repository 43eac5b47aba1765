"""The Python sampler's rates over a real samplerd: DistributedWeightedSampler iterating an epoch
(indices/s to the trainer) and reporting every index's loss (pairs/s until flush() returned).

    python3 bench/sampler_iteration_bench.py --samplerd bazel-bin/server/samplerd [--n 1000000]
        [--epochs 4] [--report_batch 4096] [--prefetch 1]

One rank (world_size 1), a LOSS-policy job of N samples; epoch 0 is timed too but each figure is
the median over the epochs. An epoch's iteration time includes its start: the previous epoch's
EndEpoch and the server's recompute and plan (what a trainer waits for at the epoch boundary).
Imports whichever samplerd package is first on sys.path (PYTHONPATH picks another tree's).
Prints one JSON line.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import samplerd
from samplerd.torch import DistributedWeightedSampler


def start_server(binary: str):
    process = subprocess.Popen([binary, "--plaintext", "--port=0"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    for line in process.stdout:
        if line.startswith("samplerd listening on "):
            return process, line.split()[-1]
    raise RuntimeError(f"{binary} did not start (exit {process.wait()})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samplerd", required=True)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--report_batch", type=int, default=4096)
    parser.add_argument("--prefetch", type=int, default=1)
    args = parser.parse_args()
    process, address = start_server(args.samplerd)
    try:
        client = samplerd.Client(address, timeout=120)
        client.create_job("bench", num_samples=args.n, world_size=1, loss="loss")
        sampler = DistributedWeightedSampler(client, "bench", rank=0, world_size=1,
                                             prefetch=bool(args.prefetch), timeout=120)
        rng = np.random.default_rng(0)
        iterate, report = [], []
        for _ in range(args.epochs):
            t0 = time.perf_counter()
            indices = np.fromiter(iter(sampler), dtype=np.int64, count=-1)
            t1 = time.perf_counter()
            losses = rng.random(indices.size, dtype=np.float32)
            for k in range(0, indices.size, args.report_batch):
                sampler.report(indices[k:k + args.report_batch],
                               losses[k:k + args.report_batch])
            sampler.flush()
            t2 = time.perf_counter()
            assert indices.size == args.n, indices.size
            iterate.append(t1 - t0)
            report.append(t2 - t1)
        sampler.close()
        client.close()
    finally:
        process.terminate()
        process.wait()
    print(json.dumps({
        "samplerd_package": os.path.dirname(samplerd.__file__),
        "n": args.n, "epochs": args.epochs, "report_batch": args.report_batch,
        "iterate_s": [round(t, 4) for t in iterate], "report_s": [round(t, 4) for t in report],
        "iterate_median_s": round(statistics.median(iterate), 4),
        "report_median_s": round(statistics.median(report), 4),
        "iterate_Mps": round(args.n / statistics.median(iterate) / 1e6, 3),
        "report_Mpairs_s": round(args.n / statistics.median(report) / 1e6, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
