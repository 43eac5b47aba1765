"""Before/after of two checkouts in one session, alternating: the CPU recompute and plans
(//bench:kernels_benchmark), StreamShard to one rank and ShardReader (//bench:shard_reader_bench,
its in-process server), the epoch boundary (//bench:epoch_boundary_bench, W = 1 and 64 against
the checkout's samplerd) and the Python sampler (bench/sampler_iteration_bench.py with the
checkout's samplerd package and binary). Prints each run's figures as JSON lines, then per
figure the median of each checkout and the ratio after / before.

    # In each checkout first:
    bazel build //server:samplerd //bench:kernels_benchmark //bench:epoch_boundary_bench \\
        //bench:shard_reader_bench
    nice -n 10 .venv/bin/python bench/compare_trees.py BEFORE_DIR AFTER_DIR [--rounds 5]

Rounds alternate which checkout runs first. Ratios of one run only mean anything: the figures
move with the machine's load.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS_FILTER = "BM_(Recompute|Plan).*/(1000000|10000000)/"


def run(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env,
                         timeout=900).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def kernels(tree):
    out = subprocess.run([f"{tree}/bazel-bin/bench/kernels_benchmark",
                          f"--benchmark_filter={KERNELS_FILTER}", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True, timeout=900).stdout
    return {f"kernels {b['name'].split('/iterations')[0]} ms": b["real_time"]
            for b in json.loads(out)["benchmarks"] if b.get("run_type") == "iteration"}


def shard_reader(tree, n):
    figures = {}
    for line in run([f"{tree}/bazel-bin/bench/shard_reader_bench", f"--num_samples={n}",
                     "--repeats=3"]):
        what = "server alone" if line["what"].startswith("server") else f"Next({line['n']})"
        figures[f"shard_reader {what} M indices/s"] = line["indices_per_s"] / 1e6
    return figures


def epoch_boundary(tree):
    figures = {}
    for line in run([f"{tree}/bazel-bin/bench/epoch_boundary_bench",
                     f"--samplerd={tree}/bazel-bin/server/samplerd", "--world_sizes=1,64",
                     "--max_connections=64"]):
        w = line["world_size"]
        figures[f"epoch_boundary W={w} all ranks started ms"] = line["boundary_first_ms"]
        figures[f"epoch_boundary W={w} all ranks done ms"] = line["boundary_all_ms"]
    return figures


def python_sampler(tree, n):
    env = dict(os.environ, PYTHONPATH=f"{tree}/client/python")
    (line,) = run([sys.executable, f"{HERE}/sampler_iteration_bench.py",
                   f"--samplerd={tree}/bazel-bin/server/samplerd", f"--n={n}", "--epochs=3"],
                  env=env)
    assert line["samplerd_package"].startswith(tree), line["samplerd_package"]
    return {"python sampler iterate epoch s": line["iterate_median_s"],
            "python sampler report epoch s": line["report_median_s"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shard_n", type=int, default=10_000_000)
    parser.add_argument("--python_n", type=int, default=1_000_000)
    args = parser.parse_args()
    trees = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    figures = {}  # name -> {"before": [...], "after": [...]}
    for r in range(args.rounds):
        for which in (("before", "after") if r % 2 == 0 else ("after", "before")):
            tree = trees[which]
            started = time.time()
            got = {}
            got.update(kernels(tree))
            got.update(shard_reader(tree, args.shard_n))
            got.update(epoch_boundary(tree))
            got.update(python_sampler(tree, args.python_n))
            print(json.dumps({"round": r + 1, "tree": which,
                              "seconds": round(time.time() - started),
                              "load": os.getloadavg()[0], **got}), flush=True)
            for name, value in got.items():
                figures.setdefault(name, {"before": [], "after": []})[which].append(value)
    print(f"\n{'figure':58} {'before':>10} {'after':>10} {'after/before':>12}")
    for name, by in figures.items():
        b, a = statistics.median(by["before"]), statistics.median(by["after"])
        print(f"{name:58} {b:10.3f} {a:10.3f} {a / b:12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
