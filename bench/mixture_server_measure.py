"""A mixture job of N = 10^12 samples in 10^4 groups (weights 1 + k mod 7), window M = 10^7, 8
ranks, served by the samplerd binary (bazel-bin/server/samplerd, built with `bazel build
//server:samplerd`): the server's RSS (VmRSS, and its peak VmHWM) after creation and after each
epoch boundary, the plan time and the boundary's latency (EndEpoch of the last rank until the
next epoch is served) when the ranks train 7 s per epoch. Run from the repository root:
`.venv/bin/python bench/mixture_server_measure.py [--train_s S] [M ...]` (default 7 s and
M = 10^7; one server, one job per M in turn; with --train_s 0 the ranks end each epoch at once,
so the boundary shows the window's plan time; bench/RESULTS.md, "Mixture jobs served")."""
import argparse, subprocess, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--train_s", type=float, default=7.0)
parser.add_argument("m", nargs="*", type=float, default=[1e7])
args = parser.parse_args()
sys.path.insert(0, "client/python")
import samplerd
from samplerd._proto import samplerd_pb2 as pb
proc = subprocess.Popen(["bazel-bin/server/samplerd", "--port=0", "--plaintext", "--log_level=1"],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
addr = proc.stdout.readline().split()[-1]
def rss():
    for line in open(f"/proc/{proc.pid}/status"):
        if line.startswith("VmRSS"): return int(line.split()[1]) // 1024
def hwm():
    for line in open(f"/proc/{proc.pid}/status"):
        if line.startswith("VmHWM"): return int(line.split()[1]) // 1024
try:
    with samplerd.Client(addr, timeout=600) as c:
        print("idle RSS MiB", rss())
        for m in [int(m) for m in args.m]:
            spec = pb.JobSpec(world_size=8, seed=1, samples_per_epoch=m,
                              mixture=pb.MixtureSpec(group_sizes=[10**8] * 10**4,
                                                     group_weights=[1 + k % 7 for k in range(10**4)]))
            t = time.time()
            c.create_job_from_spec(f"m{m}", spec)
            print("M", m, "create s", round(time.time() - t, 2), "RSS MiB", rss(), "peak", hwm())
            for e in range(3):
                time.sleep(args.train_s)  # The ranks train: the next window is planned ahead.
                for r in range(8):
                    c.end_epoch(f"m{m}", e, r)
                t0 = time.time()
                while True:
                    st = c.status(f"m{m}")
                    if st.job.current_epoch == e + 1 and st.job.plan_ready: break
                    time.sleep(0.05)
                print(" epoch", e + 1, "last_plan_ms", round(st.last_plan_ms, 1), "boundary s", round(time.time() - t0, 3), "RSS MiB", rss(), "peak", hwm())
finally:
    proc.terminate(); proc.wait()
