"""Weight policies on real data, against the samplers a user would pick instead.

Trains a small MLP with 4 DDP ranks (gloo, CPU) on scikit-learn's bundled data sets (no
download), per seed and paired (every arm of a seed starts from the same model and the same
data), and compares:

  uniform        torch DistributedSampler (shuffle)
  wrs            a per-rank torch WeightedRandomSampler with weights 1/count(class)
  cb             samplerd CLASS_BALANCED
  loss           samplerd LOSS (uniform base)
  cb_loss        samplerd CLASS_BALANCED x LOSS, normalised over the whole data set
  cb_loss_groups samplerd CLASS_BALANCED x LOSS with loss_within_groups (each class keeps its
                 class-balanced share; the losses move weight only inside a class)
  cb_mult        samplerd CLASS_BALANCED x MULTIPLICATIVE (eta 0.1)

The samplerd arms run against the real samplerd binary. Data sets:

  digits_lt   load_digits, long-tailed with imbalance factor 50 (training counts 100, 64, 41,
              27, 17, 11, 7, 4, 3, 2), a balanced test set of 74 per class (740)
  digits      load_digits, balanced (100 per class), the same test set
  digits_noisy  digits with 20% of the training labels replaced by a random other class
  cancer_lt   load_breast_cancer, minority (malignant) 1:50 (250 benign, 5 malignant), a
              balanced test set of 100 per class

Reports per arm: balanced accuracy (mean per-class recall) and tail accuracy (mean recall of
the 3 rarest training classes; for balanced sets the 3 classes of digits 7, 8, 9) at the end,
and steps to a target balanced accuracy (evaluated every --eval_every steps); then the paired
difference of each arm from `cb` (class balance alone): mean, standard deviation over seeds,
and on how many seeds the arm was better.

    .venv/bin/python bench/policy_benchmark.py --samplerd bazel-bin/server/samplerd
    .venv/bin/python bench/policy_benchmark.py --smoke      # seconds: 1 seed, 20 steps

Writes the results as JSON (--json) and prints Markdown tables (bench/RESULTS.md quotes them).
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
from torch.utils.data import (DataLoader, DistributedSampler, TensorDataset,
                              WeightedRandomSampler)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import samplerd  # noqa: E402
from ddp_demo import start_samplerd  # noqa: E402
from ddp_train import free_port  # noqa: E402
from samplerd.torch import DistributedWeightedSampler, IndexedDataset  # noqa: E402

ARMS = ("uniform", "wrs", "cb", "loss", "cb_loss", "cb_loss_groups", "cb_mult")
DATASETS = ("digits_lt", "digits", "digits_noisy", "cancer_lt")
# The LOSS settings of every loss arm (the demo's: examples/ddp_train.py).
LOSS_PARAMS = dict(ema_decay=0.5, alpha=1.0, mix=0.1, clamp_hi=20.0)
SAMPLERD_POLICIES = {
    "cb": dict(base="class_balanced"),
    "loss": dict(loss="loss", **LOSS_PARAMS),
    "cb_loss": dict(base="class_balanced", loss="loss", **LOSS_PARAMS),
    "cb_loss_groups": dict(base="class_balanced", loss="loss", loss_within_groups=True,
                           **LOSS_PARAMS),
    "cb_mult": dict(base="class_balanced", loss="multiplicative", eta=0.1, clamp_hi=20.0),
}
TARGET = {"digits_lt": 0.80, "digits": 0.90, "digits_noisy": 0.85, "cancer_lt": 0.85}


def long_tail_counts(n_max, classes, imbalance):
    return [int(n_max * imbalance ** (-c / (classes - 1))) for c in range(classes)]


def make_dataset(name, seed):
    """(x_train, y_train, x_test, y_test, tail classes) as torch tensors; seed picks the split."""
    from sklearn.datasets import load_breast_cancer, load_digits
    g = np.random.default_rng(seed)
    if name.startswith("digits"):
        data = load_digits()
        x_all, y_all = data.data / 16.0, data.target
        classes, per_test = 10, 74
        counts = long_tail_counts(100, 10, 50) if name == "digits_lt" else [100] * 10
    else:
        data = load_breast_cancer()
        x_all = (data.data - data.data.mean(0)) / data.data.std(0)
        # Class 0 is malignant (212), 1 benign (357): the benign majority first.
        y_all = 1 - data.target
        classes, per_test = 2, 100
        counts = [250, 5]
    train, test = [], []
    for c in range(classes):
        idx = g.permutation(np.flatnonzero(y_all == c))
        test.extend(idx[:per_test])
        train.extend(idx[per_test:per_test + counts[c]])
    train = g.permutation(np.array(train))
    y_train = y_all[train].copy()
    if name == "digits_noisy":
        flip = g.random(len(y_train)) < 0.2
        y_train[flip] = (y_train[flip] + g.integers(1, classes, flip.sum())) % classes
    tail = sorted(np.argsort(counts, kind="stable")[:3]) if classes > 3 else [1]
    if counts == sorted(counts, reverse=True) and len(set(counts)) == 1:
        tail = [7, 8, 9]
    as_x = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    as_y = lambda a: torch.tensor(a, dtype=torch.int64)  # noqa: E731
    return (as_x(x_all[train]), as_y(y_train), as_x(x_all[test]), as_y(y_all[test]),
            [int(c) for c in tail])


def make_model(seed, features, classes):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, classes))


def recalls(model, x, y, classes):
    with torch.no_grad():
        pred = model(x).argmax(dim=1)
    return [float((pred[y == c] == c).float().mean()) for c in range(classes)]


def train_arm(cfg, arm, dataset, seed, rank, world, data, address):
    """Trains one arm; returns (final recalls per class, steps to the target or None)."""
    x, y, x_test, y_test, _ = data
    classes = int(y_test.max()) + 1
    n = len(y)
    model = DDP(make_model(seed, x.shape[1], classes))
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    sampler, loader_ds = None, TensorDataset(x, y)
    if arm == "uniform":
        sampler = DistributedSampler(loader_ds, num_replicas=world, rank=rank, shuffle=True,
                                     seed=seed)
    elif arm == "wrs":
        counts = torch.bincount(y, minlength=classes).double()
        sampler = WeightedRandomSampler((1.0 / counts)[y], num_samples=-(-n // world),
                                        replacement=True,
                                        generator=torch.Generator().manual_seed(seed * 97 + rank))
    else:
        job = f"{dataset}-{arm}-{seed}"
        if rank == 0:
            with samplerd.Client(address) as c:
                c.create_job(job, num_samples=n, world_size=world, seed=seed, replacement=True,
                             **SAMPLERD_POLICIES[arm])
                if "base" in SAMPLERD_POLICIES[arm]:
                    c.upload_labels(job, y.numpy())
        dist.barrier()
        sampler = DistributedWeightedSampler(address, job, rank, world, report_batch_size=256)
        loader_ds = IndexedDataset(loader_ds)
    loader = DataLoader(loader_ds, sampler=sampler, batch_size=cfg["batch_size"])
    steps, epoch, reached = 0, 0, None
    while steps < cfg["steps"]:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        for batch in loader:
            if isinstance(sampler, DistributedWeightedSampler):
                idx, (xb, yb) = batch
            else:
                xb, yb = batch
            loss = F.cross_entropy(model(xb), yb, reduction="none")
            if isinstance(sampler, DistributedWeightedSampler):
                sampler.report(idx, loss.detach())
            opt.zero_grad()
            loss.mean().backward()
            opt.step()
            steps += 1
            if reached is None and steps % cfg["eval_every"] == 0:
                if np.mean(recalls(model.module, x_test, y_test, classes)) >= TARGET[dataset]:
                    reached = steps
            if steps >= cfg["steps"]:
                break
        epoch += 1
    if isinstance(sampler, DistributedWeightedSampler):
        sampler.close()
        dist.barrier()  # Every rank is done with the job: delete it (the server caps the jobs).
        if rank == 0:
            with samplerd.Client(address) as c:
                c.delete_job(job)
    return recalls(model.module, x_test, y_test, classes), reached


def worker(rank, world, cfg):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["master_port"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    try:
        for dataset in cfg["datasets"]:
            for seed in range(cfg["seeds"]):
                data = make_dataset(dataset, 1000 + seed)
                for arm in cfg["arms"]:
                    t0 = time.time()
                    rec, reached = train_arm(cfg, arm, dataset, seed, rank, world, data,
                                             cfg["address"])
                    results.append({"dataset": dataset, "seed": seed, "arm": arm,
                                    "recalls": rec, "tail": data[4], "steps_to_target": reached,
                                    "seconds": time.time() - t0})
                    if rank == 0 and cfg["partial"]:  # A line per run, kept if a later one fails.
                        with open(cfg["partial"], "a") as f:
                            f.write(json.dumps(results[-1]) + "\n")
                    if rank == 0 and cfg["verbose"]:
                        print(f"{dataset} seed {seed} {arm:<15} bal.acc {np.mean(rec):.3f} "
                              f"tail {np.mean([rec[c] for c in data[4]]):.3f} "
                              f"({time.time() - t0:.1f} s)", flush=True)
        if rank == 0:
            with open(cfg["report"], "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()


def run(binary, *, datasets=DATASETS, arms=ARMS, seeds=5, steps=500, eval_every=25,
        batch_size=8, lr=0.05, world=4, verbose=True, partial=""):
    """Runs the benchmark on a fresh samplerd; returns the per-run results (list of dicts).
    partial: a file that gets each run's result as a JSON line as soon as it is known."""
    import torch.multiprocessing as mp
    proc, address = start_samplerd(binary)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = {"address": address, "datasets": list(datasets), "arms": list(arms),
                   "seeds": seeds, "steps": steps, "eval_every": eval_every,
                   "batch_size": batch_size, "lr": lr, "verbose": verbose,
                   "report": os.path.join(tmp, "results.json"), "master_port": free_port(),
                   "partial": partial}
            mp.start_processes(worker, args=(world, cfg), nprocs=world, join=True,
                               start_method="spawn")
            with open(cfg["report"]) as f:
                return json.load(f)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def summarise(results, baseline="cb"):
    """Per data set: per arm the means over seeds, and the paired difference from `baseline`."""
    table = {}
    for dataset in dict.fromkeys(r["dataset"] for r in results):
        rows = [r for r in results if r["dataset"] == dataset]
        by = {}
        for r in rows:
            bal = float(np.mean(r["recalls"]))
            tail = float(np.mean([r["recalls"][c] for c in r["tail"]]))
            by.setdefault(r["arm"], {})[r["seed"]] = (bal, tail, r["steps_to_target"])
        base = by.get(baseline, {})
        arms = {}
        for arm, per_seed in by.items():
            seeds = sorted(per_seed)
            bal = np.array([per_seed[s][0] for s in seeds])
            tail = np.array([per_seed[s][1] for s in seeds])
            reached = [per_seed[s][2] for s in seeds if per_seed[s][2] is not None]
            entry = {"bal": bal.mean(), "bal_sd": bal.std(ddof=1) if len(bal) > 1 else 0.0,
                     "tail": tail.mean(), "reached": len(reached), "seeds": len(seeds),
                     "steps": float(np.median(reached)) if reached else None}
            paired = [s for s in seeds if s in base]
            if paired:
                d = np.array([per_seed[s][0] - base[s][0] for s in paired])
                dt = np.array([per_seed[s][1] - base[s][1] for s in paired])
                entry.update(d_bal=d.mean(), d_bal_sd=d.std(ddof=1) if len(d) > 1 else 0.0,
                             d_tail=dt.mean(), d_tail_sd=dt.std(ddof=1) if len(dt) > 1 else 0.0,
                             wins=int((d > 0).sum()), ties=int((d == 0).sum()),
                             paired=len(paired))
            arms[arm] = entry
        table[dataset] = arms
    return table


def markdown(table, baseline="cb"):
    lines = []
    for dataset, arms in table.items():
        lines.append(f"\n**{dataset}** (target balanced accuracy {TARGET[dataset]:.2f})\n")
        lines.append(f"| arm | balanced acc (mean ± sd) | tail-3 acc | reached target | "
                     f"median steps to target | Δ bal. acc vs {baseline} (mean ± sd) | "
                     f"Δ tail vs {baseline} | better on seeds |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for arm in ARMS:
            if arm not in arms:
                continue
            e = arms[arm]
            steps = f"{e['steps']:.0f}" if e["steps"] is not None else "-"
            diff = (f"{e['d_bal']:+.3f} ± {e['d_bal_sd']:.3f}", f"{e['d_tail']:+.3f}",
                    f"{e['wins']}/{e['paired']}" + (f" ({e['ties']} tied)" if e["ties"] else "")) \
                if "d_bal" in e and arm != baseline else ("—", "—", "—")
            lines.append(f"| {arm} | {e['bal']:.3f} ± {e['bal_sd']:.3f} | {e['tail']:.3f} | "
                         f"{e['reached']}/{e['seeds']} | {steps} | {diff[0]} | {diff[1]} | "
                         f"{diff[2]} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samplerd",
                        default=os.environ.get("SAMPLERD_BIN", "bazel-bin/server/samplerd"))
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--json", default="",
                        help="also write the per-run results here (a JSON line per run as it "
                             "ends: FILE.partial)")
    parser.add_argument("--smoke", action="store_true",
                        help="1 seed, 20 steps, digits_lt only: checks that every arm runs")
    args = parser.parse_args()
    if not os.access(args.samplerd, os.X_OK):
        sys.exit(f"samplerd binary not found at {args.samplerd}: `bazel build //server:samplerd`")
    datasets, seeds, steps = args.datasets.split(","), args.seeds, args.steps
    if args.smoke:
        datasets, seeds, steps = ["digits_lt"], 1, 20
    t0 = time.time()
    results = run(args.samplerd, datasets=datasets, arms=args.arms.split(","), seeds=seeds,
                  steps=steps, eval_every=args.eval_every,
                  partial=args.json + ".partial" if args.json else "")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}; {seeds} seeds x {steps} steps, "
          f"4 ranks x batch 8; {time.time() - t0:.0f} s")
    print(markdown(summarise(results)))


if __name__ == "__main__":
    main()
