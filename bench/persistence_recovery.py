"""How long samplerd takes to come back after a crash, and what it keeps on disk.

    python3 bench/persistence_recovery.py [--n 10000000]

One job of N samples (loss policy, M = N/2 without replacement, 2 ranks, so that plans depend on
the weights) in a fresh --data_dir: every rank reports a loss for every index of its epoch-0 shard,
both end epoch 0, then they report all of epoch 1. That is the largest log a job can have: a full
epoch of losses after its snapshot. Then SIGKILL, and a restart on the same directory is timed up
to its "listening" line (the job restored: snapshot read and verified, epoch 1 planned from it,
the log replayed). Prints the file sizes and the restart time, and checks that the restarted
server reports the same state as before the kill.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import samplerd  # noqa: E402

BATCH = 1 << 20


def start(binary, data_dir, n):
    begin = time.monotonic()
    proc = subprocess.Popen([binary, "--plaintext", "--port=0", "--log_level=1",
                             f"--data_dir={data_dir}",
                             f"--max_samples_per_job={max(n, 1 << 32)}"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("samplerd listening on "):
        proc.kill()
        raise RuntimeError(f"samplerd did not start: {line!r}")
    return proc, line.split()[-1], time.monotonic() - begin


def report_epoch(client, epoch, world):
    for rank in range(world):
        shard = client.read_shard("rec", epoch, rank, world)
        for seq, start in enumerate(range(0, shard.size, BATCH)):
            part = shard[start:start + BATCH]
            client.report_losses("rec", epoch, rank, part, (part % 97) / 97.0,
                                 np.arange(start, start + part.size), seq=seq)


def state(client):
    s = client.status("rec")
    return (s.job.current_epoch, [(r.losses_accepted, r.ended) for r in s.ranks], s.samples_seen,
            s.weights.min, s.weights.max)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--samplerd", default=os.path.join(ROOT, "bazel-bin", "server", "samplerd"))
    args = parser.parse_args()
    n, world = args.n, 2
    data_dir = tempfile.mkdtemp(prefix="samplerd-recovery-")
    try:
        proc, address, cold = start(args.samplerd, data_dir, n)
        with samplerd.Client(address, timeout=600) as c:
            c.create_job("rec", num_samples=n, world_size=world, samples_per_epoch=n // 2,
                         loss="loss")
            report_epoch(c, 0, world)
            for rank in range(world):
                c.end_epoch("rec", 0, rank)
            report_epoch(c, 1, world)
            before = state(c)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        job_dir = os.path.join(data_dir, "jobs", "rec")
        sizes = {f: os.path.getsize(os.path.join(job_dir, f)) for f in sorted(os.listdir(job_dir))}
        proc, address, restart = start(args.samplerd, data_dir, n)
        with samplerd.Client(address, timeout=600) as c:
            after = state(c)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"N = {n:.0e}, {os.cpu_count()} cores; files after the kill:")
    for name, size in sizes.items():
        print(f"  {name}: {size / 2**20:.1f} MiB ({size / n:.1f} bytes per sample)")
    print(f"restart with the job (snapshot + a full epoch of logged losses): {restart:.2f} s "
          f"(an empty data_dir: {cold:.2f} s)")
    print("state after the restart equals the state before the kill:", after == before)
    if after != before:
        print("  before:", before, "\n  after: ", after)
        sys.exit(1)


if __name__ == "__main__":
    main()
