"""How much faster does a weight policy train, against the samplers a user would pick instead?

Trains a small MLP (features-128-classes) with real DDP ranks (gloo, CPU) and, for the samplerd
arms, the real samplerd binary; every arm of a seed starts from the same model on the same
split (paired seeds). Reports, per data set and arm, the test balanced accuracy curve, the
steps to targets set from the uniform baseline (90% and 97% of its final value), the final
value, and the paired difference of each from uniform (mean ± sd over seeds, seeds won);
writes the curves as a PNG (--plot) and the per-run results as JSON (--json).

Arms (bench/policy_arms.py): uniform DistributedSampler, per-rank WeightedRandomSampler, samplerd
class balance alone, samplerd LOSS, samplerd LOSS with importance weights, samplerd
REDUCIBLE_LOSS, in-process RHO-LOSS, RHO-LOSS through samplerd (uniform candidates, or candidates
drawn by REDUCIBLE_LOSS weights), and loss-rank batch selection. An arm whose API this client or
server lacks is skipped with the reason printed.

Data sets (bench/policy_data.py): the quick version on scikit-learn's digits and breast cancer
(clean, long-tailed, 20% wrong labels), the full one on Fashion-MNIST from Debian's
dataset-fashion-mnist (60,000 + 10,000 images, no download).

    .venv/bin/python bench/policy_benchmark.py --quick --plot quick.png --json quick.json
    .venv/bin/python bench/policy_benchmark.py --full --plot fmnist.png --json fmnist.json
    .venv/bin/python bench/policy_benchmark.py --smoke     # seconds: every arm runs
    .venv/bin/python bench/policy_benchmark.py --report fmnist.json --baseline cb  # tables again

(--samplerd, or $SAMPLERD_BIN, names the binary: `bazel build //server:samplerd`.)
"""

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, HERE)
from ddp_demo import start_samplerd  # noqa: E402
from ddp_train import free_port, spawn_ranks  # noqa: E402
import policy_arms  # noqa: E402
import policy_data  # noqa: E402
import policy_report  # noqa: E402

ARMS = policy_arms.ARMS
# The presets. steps x batch_size x world draws per run; window: samplerd's samples_per_epoch
# (the loss policies recompute the weights once per window; min(N, window)).
PRESETS = {
    "quick": dict(datasets=policy_data.SKLEARN_SETS, seeds=5, steps=300, eval_every=15,
                  batch_size=16, world=2, lr=0.05, il_steps=300, window=1600),
    "full": dict(datasets=policy_data.FMNIST_SETS, seeds=5, steps=300, eval_every=20,
                 batch_size=32, world=2, lr=0.05, il_steps=400, window=1600),
    "smoke": dict(datasets=("digits_noisy",), seeds=1, steps=20, eval_every=5,
                  batch_size=8, world=2, lr=0.05, il_steps=50, window=320),
}


def train_arm(cfg, arm, seed, rank, world, data, il, job):
    """Trains one arm; returns (curve [[step, balanced acc]], final recalls, mislabelled share
    of this rank's draws or None)."""
    model = make_ddp(seed, data)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    source = policy_arms.make_source(arm, cfg, data, seed, rank, world, cfg["address"], il,
                                     model.module, job)
    curve, drawn, mislabelled = [], 0, 0
    for step in range(1, cfg["steps"] + 1):
        idx, w, xb, yb = source.next_batch(model.module)
        drawn += len(idx)
        mislabelled += int(data.noisy[idx].sum())
        loss = F.cross_entropy(model(xb), yb, reduction="none")
        source.feedback(idx, loss.detach())
        objective = (w * loss).mean() if w is not None else loss.mean()
        opt.zero_grad()
        objective.backward()
        opt.step()
        if step % cfg["eval_every"] == 0 or step == cfg["steps"]:
            if rank == 0:  # The model is the same on every rank; the others go on.
                curve.append([step, policy_arms.balanced_accuracy(
                    model.module, data.x_test, data.y_test, data.classes)[0]])
    source.close()
    recalls = policy_arms.balanced_accuracy(model.module, data.x_test, data.y_test,
                                            data.classes)[1]
    return curve, recalls, (mislabelled / drawn if bool(data.noisy.any()) else None)


def make_ddp(seed, data):
    return DDP(policy_arms.make_model(seed, data.x.shape[1], data.classes))


def worker(rank, world, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["master_port"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results, started = [], time.time()
    try:
        for seed in range(cfg["seeds"]):
            # Seeds are the outer loop, so that a time budget leaves whole seeds of every set.
            stop = torch.tensor([int(rank == 0 and seed > 0 and cfg["budget_s"] > 0
                                     and time.time() - started > cfg["budget_s"])])
            dist.broadcast(stop, src=0)
            if stop.item():
                if rank == 0:
                    print(f"policy_benchmark: time budget of {cfg['budget_s']} s spent after "
                          f"{seed} seed(s); stopping", flush=True)
                break
            for dataset in cfg["datasets"]:
                data = policy_data.make_dataset(dataset, 1000 + seed)
                il, il_acc = None, None
                if any(a in policy_arms.NEEDS_IRREDUCIBLE for a in cfg["arms"]):
                    # Rank 0 trains the irreducible-loss model; every rank gets its losses.
                    il = torch.zeros(len(data.y))
                    if rank == 0:
                        il, il_acc = policy_arms.irreducible_losses(data, seed, cfg["il_steps"])
                    dist.broadcast(il, src=0)
                for arm in cfg["arms"]:
                    t0 = time.time()
                    curve, recalls, share = train_arm(cfg, arm, seed, rank, world, data, il,
                                                      job=f"{dataset}-{arm}-{seed}")
                    shares = [None] * world
                    dist.all_gather_object(shares, share)
                    if rank != 0:
                        continue
                    results.append({
                        "dataset": dataset, "seed": seed, "arm": arm, "curve": curve,
                        "recalls": recalls, "tail": data.tail,
                        "noisy_share": None if share is None else float(np.mean(shares)),
                        "il_model_bal_acc": il_acc, "n_train": len(data.y),
                        "seconds": time.time() - t0})
                    if cfg["partial"]:  # A line per run, kept if a later one fails.
                        with open(cfg["partial"], "a") as f:
                            f.write(json.dumps(results[-1]) + "\n")
                    if cfg["verbose"]:
                        print(f"{dataset} seed {seed} {arm:<9} bal.acc {curve[-1][1]:.3f} "
                              f"({time.time() - t0:.1f} s)", flush=True)
        if rank == 0:
            with open(cfg["report"], "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()


def run(binary, *, datasets, arms=ARMS, seeds, steps, eval_every, batch_size, world, lr,
        il_steps, window, budget_s=0, verbose=True, partial=""):
    """Runs the benchmark on a fresh samplerd. Returns (per-run results, {arm: why skipped}):
    the arms whose API this client or server lacks are skipped. budget_s > 0: no new seed
    starts after that many seconds (the results hold the seeds that ran)."""
    for d in datasets:
        reason = policy_data.available(d)
        if reason:
            raise ValueError(reason)
    proc, address = start_samplerd(binary)
    try:
        support = policy_arms.supports(address)
        skipped = {a: support[a] for a in arms if support.get(a)}
        for arm, why in skipped.items():
            print(f"policy_benchmark: skipping arm {arm}: {why}", flush=True)
        cfg = {"address": address, "datasets": list(datasets),
               "arms": [a for a in arms if a not in skipped], "seeds": seeds, "steps": steps,
               "eval_every": eval_every, "batch_size": batch_size, "lr": lr,
               "il_steps": il_steps, "window": window, "budget_s": budget_s,
               "verbose": verbose,
               "master_port": free_port(), "partial": partial}
        with tempfile.TemporaryDirectory() as tmp:
            return spawn_ranks(worker, world, cfg, os.path.join(tmp, "results.json")), skipped
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samplerd",
                        default=os.environ.get("SAMPLERD_BIN", "bazel-bin/server/samplerd"))
    mode = parser.add_mutually_exclusive_group()
    for name in PRESETS:
        mode.add_argument(f"--{name}", dest="preset", action="store_const", const=name,
                          help=f"preset: {PRESETS[name]}")
    parser.set_defaults(preset="quick")
    parser.add_argument("--datasets", help=f"comma-separated, of {','.join(policy_data.DATASETS)}")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated, of {','.join(ARMS + policy_arms.EXTRA_ARMS)}")
    for key in ("seeds", "steps", "eval_every", "batch_size", "world", "il_steps", "window"):
        parser.add_argument(f"--{key}", type=int, help="overrides the preset")
    parser.add_argument("--lr", type=float, help="overrides the preset")
    parser.add_argument("--budget_s", type=int, default=0,
                        help="start no new seed after this many seconds (0: no limit)")
    parser.add_argument("--json", default="",
                        help="also write the per-run results here (a JSON line per run as it "
                             "ends: FILE.partial)")
    parser.add_argument("--plot", default="", help="write the curves here (PNG)")
    parser.add_argument("--baseline", default="uniform",
                        help="the arm the paired differences are taken from")
    parser.add_argument("--report", default="",
                        help="run nothing: print the tables (and --plot) of a --json file")
    args = parser.parse_args()
    if args.report:
        with open(args.report) as f:
            stored = json.load(f)
        arms = [a for a in ARMS + policy_arms.EXTRA_ARMS
                if any(r["arm"] == a for r in stored["results"])]
        table = policy_report.summarise(stored["results"], baselines=(args.baseline,))
        if args.plot:
            policy_report.plot(stored["results"], table, arms, args.plot)
        print(f"{args.report}: {stored['config']}")
        for arm, why in stored["skipped"].items():
            print(f"skipped {arm}: {why}")
        print(policy_report.markdown(table, arms, baseline=args.baseline))
        return
    if not os.access(args.samplerd, os.X_OK):
        sys.exit(f"samplerd binary not found at {args.samplerd}: `bazel build //server:samplerd`")
    cfg = dict(PRESETS[args.preset])
    for key in ("seeds", "steps", "eval_every", "batch_size", "world", "il_steps", "window",
                "lr"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.datasets:
        cfg["datasets"] = args.datasets.split(",")
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS + policy_arms.EXTRA_ARMS]
    if unknown or "uniform" not in arms:
        sys.exit(f"--arms: {unknown or 'uniform missing'}: the arms are "
                 f"{','.join(ARMS + policy_arms.EXTRA_ARMS)}, and uniform sets the targets")
    t0 = time.time()
    results, skipped = run(args.samplerd, arms=arms, budget_s=args.budget_s,
                           partial=args.json + ".partial" if args.json else "", **cfg)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "skipped": skipped, "results": results}, f)
    table = policy_report.summarise(results, baselines=(args.baseline,))
    if args.plot:
        policy_report.plot(results, table, arms, args.plot)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}; preset {args.preset} {cfg}; "
          f"{time.time() - t0:.0f} s")
    for arm, why in skipped.items():
        print(f"skipped {arm}: {why}")
    print(policy_report.markdown(table, arms, baseline=args.baseline))


if __name__ == "__main__":
    main()
