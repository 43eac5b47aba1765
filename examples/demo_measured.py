"""The demo's last part (examples/ddp_demo.py): the policy that measured best against its
natural baseline, live and from the benchmark's checked-in results, and where none helps.

Live: RHO-LOSS through samplerd (a loss="reducible_loss", mix=1.0 job streams uniform candidate
batches with their irreducible losses; the trainer keeps the top 10% by loss minus irreducible
loss: samplerd.torch.select_reducible) against torch's DistributedSampler, on Fashion-MNIST
with 20% wrong labels (scikit-learn's digits with 20% wrong labels where Debian's
dataset-fashion-mnist is not installed), paired seeds, steps to 90% and 97% of the
DistributedSampler's final test balanced accuracy. It runs bench/policy_benchmark.py's arms
`uniform` and `rho_samplerd` (bench/policy_arms.py) with fewer seeds and steps than the
benchmark; every figure comes from bench/policy_report.py's summary of the runs, and the
benchmark's own figures are read from its JSON files in bench/results/ (bench/RESULTS.md).
"""

import os
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import policy_benchmark  # noqa: E402  (puts client/python on the path)
import policy_data  # noqa: E402
import policy_report  # noqa: E402

BEST, BASELINE = "rho_samplerd", "uniform"
LABELS = {"uniform": "DistributedSampler", "rho_samplerd": "RHO-LOSS through samplerd",
          "cb": "samplerd class balance alone", "loss": "samplerd LOSS (the loss factor)",
          "rho": "RHO-LOSS in the trainer"}
# The benchmark's runs (bench/RESULTS.md): RHO-LOSS through samplerd on Fashion-MNIST, and the
# first full run (every baseline, the long-tailed set).
RHO_RESULTS = "bench/results/policy_benchmark_fmnist_rho_samplerd_2026-11-29.json"
FIRST_RESULTS = "bench/results/policy_benchmark_fmnist_2026-11-29.json"
# The live comparison per data set: the benchmark's preset with fewer steps on Fashion-MNIST
# (RHO-LOSS's lead is in the first ~100 steps: bench/RESULTS.md).
LIVE = {"fmnist_noisy": dict(policy_benchmark.PRESETS["full"], steps=100, eval_every=10),
        "digits_noisy": dict(policy_benchmark.PRESETS["quick"])}
DESCRIPTION = {"fmnist_noisy": "Fashion-MNIST 14x14, 50,000 training images, 20% wrong labels",
               "digits_noisy": "scikit-learn's digits, 1,000 training images, 20% wrong labels"}


def _paired(p, fmt, what="better"):
    """'-37 ± 6 (3/3 seeds better)' from a policy_report paired difference."""
    return f"{p['mean']:{fmt}} ± {p['sd']:{fmt.lstrip('+')}} ({p['wins']}/{p['n']} seeds {what})"


def _steps(e, k):
    t = e["targets"][k]
    return f"{t['median']:.0f}" if t["median"] is not None else f"not reached ({t['reached']})"


def comparison_lines(table, dataset, best=BEST, base=BASELINE):
    """The comparison of `best` with `base` on `dataset` of a policy_report summary: steps to
    each target and the final value, each with the paired difference."""
    t = table[dataset]
    e, b = t["arms"][best], t["arms"][base]
    vs = e["vs"][base]
    lines = []
    for k, f in enumerate(policy_report.TARGET_FRACTIONS):
        lines.append(f"  steps to {f:.0%} of the {LABELS[base]}'s final ({t['targets'][k]:.3f}): "
                     f"median {_steps(e, k)} vs {_steps(b, k)}, paired "
                     f"{_paired(vs['steps'][k], '+.0f', 'fewer')}")
    lines.append(f"  final balanced accuracy: {e['final']:.3f} vs {b['final']:.3f}, paired "
                 f"{_paired(vs['final'], '+.3f')}")
    lines.append(f"  seconds per training: {e['seconds']:.0f} vs {b['seconds']:.0f} "
                 f"({e['seconds'] / b['seconds']:.1f}x: {best} computes the loss of 10 "
                 f"candidates per trained sample)")
    return lines


def live(binary, seeds, steps=None, plot=""):
    """Trains the baseline and RHO-LOSS through samplerd for `seeds` paired seeds on a fresh
    samplerd; prints the comparison (and draws the curves to `plot`, if given). Returns
    (data set, the policy_report summary), or None when RHO-LOSS through samplerd cannot run
    here (the reason printed)."""
    dataset = "fmnist_noisy"
    missing = policy_data.available(dataset)
    if missing:
        print(f"(Fashion-MNIST is not here: {missing}; the live comparison runs on "
              f"digits_noisy instead)")
        dataset = "digits_noisy"
        missing = policy_data.available(dataset)
        if missing:
            print(f"live comparison skipped: {missing}")
            return None
    cfg = dict(LIVE[dataset], seeds=seeds)
    if steps:
        cfg["steps"] = steps
    print(f"\nRHO-LOSS through samplerd vs {LABELS[BASELINE]}, live: {dataset} "
          f"({DESCRIPTION[dataset]}), {cfg['world']} DDP ranks, {cfg['steps']} steps of "
          f"{cfg['batch_size']} per rank, {seeds} paired seeds (bench/policy_benchmark.py's arms "
          f"{BASELINE} and {BEST}) ...", flush=True)
    cfg["datasets"] = [dataset]
    t0 = time.time()
    results, skipped = policy_benchmark.run(binary, arms=(BASELINE, BEST), verbose=False, **cfg)
    if BEST in skipped:
        print(f"live comparison skipped: {skipped[BEST]}")
        return None
    table = policy_report.summarise(results)
    print(f"({time.time() - t0:.0f} s)")
    for line in comparison_lines(table, dataset):
        print(line)
    if plot:
        policy_report.plot(results, table, [BASELINE, BEST], plot)
        print(f"  curves: {plot}")
    return dataset, table


def _load(path):
    import json
    full = os.path.join(ROOT, path)
    if not os.path.exists(full):
        print(f"  ({path} is not in this checkout)")
        return None
    with open(full) as f:
        return json.load(f)["results"]


def benchmark(rho_path=RHO_RESULTS):
    """The benchmark's figures for RHO-LOSS through samplerd, read from its checked-in JSON.
    Returns the summary (None if the file is missing)."""
    results = _load(rho_path)
    if results is None:
        return None
    table = policy_report.summarise(results)
    seeds = table["fmnist_noisy"]["arms"][BEST]["seeds"]
    print(f"\nThe benchmark: the same on all of Fashion-MNIST, 300 steps, {seeds} paired seeds "
          f"({rho_path}; bench/RESULTS.md \"RHO-LOSS through samplerd on Fashion-MNIST\"):")
    for dataset, what in (("fmnist_noisy", "20% wrong labels"), ("fmnist", "clean")):
        print(f" {dataset} ({what}):")
        for line in comparison_lines(table, dataset):
            print(line)
    return table


def none_helps(loss_factor_here=None, first_path=FIRST_RESULTS):
    """Where no loss policy helps: long-tailed classes with clean labels, where class balance
    alone is what helps (from the benchmark's first full run). `loss_factor_here`: this demo's
    own one-seed difference of the loss factor from class balance alone. Returns the
    summary's fmnist_lt entry (None if the file is missing)."""
    print("\nWhere no loss policy helps: long-tailed classes with clean labels. Class balance "
          "is what helps there, and nothing added to it did:")
    results = _load(first_path)
    if results is None:
        return None
    t = policy_report.summarise([r for r in results if r["dataset"] == "fmnist_lt"],
                                baselines=("uniform", "cb"))["fmnist_lt"]
    cb = t["arms"]["cb"]
    print(f"  fmnist_lt (Fashion-MNIST, 5,000 down to 100 images per class; {first_path}): "
          f"{LABELS['cb']} {_paired(cb['vs']['uniform']['final'], '+.3f')} balanced accuracy "
          f"over the {LABELS['uniform']}, 97% of its final in {_steps(cb, 1)} instead of "
          f"{_steps(t['arms']['uniform'], 1)} steps;")
    for arm in ("loss", "rho"):
        print(f"  {LABELS[arm]}: {_paired(t['arms'][arm]['vs']['cb']['final'], '+.3f')} "
              f"against class balance alone")
    if loss_factor_here is not None:
        print(f"  this demo's loss factor (class balance x LOSS, one seed, above): "
              f"{loss_factor_here:+.3f} against class balance alone")
    print("  docs/POLICIES.md says which policy to pick for which data.")
    return t
