"""The text-mixture benchmark's summary (bench/text_mixture_benchmark.py): held-out losses per
domain, steps to a target, paired differences over seeds, the online arms' weight history,
Markdown tables and a plot.

An arm's final losses are those of its last evaluation (the model at the end of its token
budget). "Learnable" means every domain but `random`; an arm's mean is the mean of its
learnable domains' held-out losses, its worst the largest of them. The target is the baseline
arm's final mean learnable loss (mean over seeds) plus TARGET_MARGIN; an arm's steps to it are
the first evaluation step whose mean learnable loss is at or below it (a run that never reached
it counts as one evaluation interval past its last step: a lower bound, the reached count is
shown beside it). Paired differences (arm - baseline, same seed) are mean ± sd over the seeds,
with the number of seeds on which the arm was better (a lower loss, fewer steps). The paired
statistics are bench/policy_report.py's.
"""

import numpy as np

from policy_report import _diff, _paired, steps_to

TARGET_MARGIN = 0.05  # The target: the baseline's final mean learnable loss + 5%.
RANDOM = "random"


def learnable(losses):
    return [v for d, v in losses.items() if d != RANDOM]


def mean_curve(curve):
    """[[step, mean learnable loss]] of a run's curve; negated, so that policy_report.steps_to
    (which looks for metric >= target) finds the first loss <= target."""
    return [[s, -float(np.mean(learnable(losses)))] for s, losses in curve]


def summarise(results, baseline="prop"):
    """Per arm: final losses per domain (means over seeds), mean and worst learnable loss, steps
    to the target, paired differences from `baseline`, and the weight history."""
    by = {}
    for r in results:
        by.setdefault(r["arm"], {})[r["seed"]] = r
    if baseline not in by:
        raise ValueError(f"no {baseline} run: the target and the paired differences need it")
    base_final = [np.mean(learnable(r["curve"][-1][1])) for r in by[baseline].values()]
    target = float(np.mean(base_final)) * (1.0 + TARGET_MARGIN)
    per = {}
    for arm, runs in by.items():
        per[arm] = {}
        for seed, r in runs.items():
            final = r["curve"][-1][1]
            steps = [s for s, _ in r["curve"]]
            past = steps[-1] + (steps[-1] - steps[-2] if len(steps) > 1 else 1)
            reached = steps_to(mean_curve(r["curve"]), -target)
            per[arm][seed] = {"final": final, "mean": float(np.mean(learnable(final))),
                              "worst": float(max(learnable(final))),
                              "reached": reached,
                              "steps": reached if reached is not None else past}
    arms = {}
    for arm, runs in per.items():
        seeds = sorted(runs)
        domains = list(runs[seeds[0]]["final"])
        e = {"seeds": len(seeds),
             "domains": {d: float(np.mean([runs[s]["final"][d] for s in seeds]))
                         for d in domains},
             "worst_domain": max((d for d in domains if d != RANDOM),
                                 key=lambda d: np.mean([runs[s]["final"][d] for s in seeds])),
             "seconds": float(np.mean([by[arm][s]["seconds"] for s in seeds]))}
        for key in ("mean", "worst"):
            v = np.array([runs[s][key] for s in seeds])
            e[key] = float(v.mean())
            e[key + "_sd"] = float(v.std(ddof=1)) if len(v) > 1 else 0.0
        reached = [runs[s]["reached"] for s in seeds if runs[s]["reached"] is not None]
        e["reached"] = len(reached)
        e["median_steps"] = float(np.median(reached)) if reached else None
        if arm != baseline:
            base = per[baseline]
            e["vs"] = {key: _paired({s: runs[s][key] for s in seeds},
                                    {s: base[s][key] for s in base}, lower_is_better=True)
                       for key in ("mean", "worst", "steps")}
        e["weights"] = weight_history([by[arm][s] for s in seeds])
        arms[arm] = e
    return {"baseline": baseline, "target": target, "arms": arms}


def weight_history(runs):
    """The weights in force each epoch, mean over the runs: {domain: [w per epoch]}; and the
    share of the chunks drawn per domain over the whole run."""
    epochs = min(len(r["weights"]) for r in runs)
    domains = list(runs[0]["weights"][0]) if epochs else []
    mean = {d: [float(np.mean([r["weights"][e][d] for r in runs])) for e in range(epochs)]
            for d in domains}
    drawn = np.sum([np.sum(r["drawn"], axis=0) for r in runs], axis=0).astype(float)
    return {"per_epoch": mean,
            "drawn_share": {d: float(drawn[k] / drawn.sum()) for k, d in enumerate(domains)}}


def markdown(table):
    """Two tables: final held-out loss per domain, and the summary with paired differences."""
    arms, base = table["arms"], table["baseline"]
    domains = list(next(iter(arms.values()))["domains"])
    lines = ["", "Final held-out loss per domain (nats per byte, mean over seeds; random "
             "bytes: ln 256 = 5.545 at best); share of the chunks drawn in brackets", ""]
    lines.append("| arm | " + " | ".join(domains) + " |")
    lines.append("|" + "---|" * (len(domains) + 1))
    for arm, e in arms.items():
        share = e["weights"]["drawn_share"]
        lines.append(f"| {arm} | " + " | ".join(
            f"{e['domains'][d]:.3f} ({share.get(d, 0):.2f})" for d in domains) + " |")
    lines += ["", f"Target: {base}'s final mean learnable loss + {TARGET_MARGIN:.0%} = "
              f"{table['target']:.3f}; differences paired with `{base}` (lower is better)", ""]
    head = ["arm", "mean learnable (± sd)", f"Δ mean vs {base}", "worst learnable (± sd)",
            f"Δ worst vs {base}", "worst domain", "reached target", "median steps",
            f"Δ steps vs {base}", "s / run"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for arm, e in arms.items():
        vs = e.get("vs")
        lines.append("| " + " | ".join([
            arm, f"{e['mean']:.3f} ± {e['mean_sd']:.3f}",
            _diff(vs["mean"], "+.3f") if vs else "—",
            f"{e['worst']:.3f} ± {e['worst_sd']:.3f}",
            _diff(vs["worst"], "+.3f") if vs else "—", e["worst_domain"],
            f"{e['reached']}/{e['seeds']}",
            f"{e['median_steps']:.0f}" if e["median_steps"] is not None else "-",
            _diff(vs["steps"], "+.0f") if vs else "—", f"{e['seconds']:.0f}"]) + " |")
    online = [a for a in arms if a in ("excess", "exp3")]
    if online:
        lines += ["", "Weights in force (mean over seeds) at epochs 1, 5, the lowest "
                  "(epoch), and the last", ""]
        lines.append("| arm | domain | epoch 1 | epoch 5 | lowest | last |")
        lines.append("|---|---|---|---|---|---|")
        for arm in online:
            for d, w in arms[arm]["weights"]["per_epoch"].items():
                if not w:
                    continue
                low = int(np.argmin(w))
                lines.append(f"| {arm} | {d} | {w[0]:.3f} | {w[min(4, len(w) - 1)]:.3f} | "
                             f"{w[low]:.3f} ({low + 1}) | {w[-1]:.3f} |")
    return "\n".join(lines)


def plot(results, table, path):
    """Panels: the mean and the worst learnable held-out loss over the steps (mean over seeds),
    the random domain's weight per epoch for every arm, and each online arm's weights."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    arms = list(table["arms"])
    online = [a for a in arms if a in ("excess", "exp3")]
    fig, axes = plt.subplots(1, 3 + len(online), figsize=(4.6 * (3 + len(online)), 4),
                             squeeze=False)
    axes = axes[0]
    for arm in arms:
        runs = [r for r in results if r["arm"] == arm]
        steps = [s for s, _ in runs[0]["curve"]]
        for ax, f in ((axes[0], np.mean), (axes[1], max)):
            ax.plot(steps, np.mean([[f(learnable(losses)) for _, losses in r["curve"]]
                                    for r in runs], axis=0), label=arm)
        w = table["arms"][arm]["weights"]["per_epoch"].get(RANDOM)
        if w:
            axes[2].plot(range(1, len(w) + 1), w, label=arm)
    axes[0].axhline(table["target"], color="grey", ls=":", lw=0.8)
    axes[0].set_title("mean learnable held-out loss")
    axes[1].set_title("worst learnable held-out loss")
    for ax in axes[:2]:
        ax.set_xlabel("step")
        ax.set_ylabel("nats per byte (mean over seeds)")
    axes[2].set_title("weight of the random-bytes domain")
    axes[2].set_xlabel("epoch")
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    for ax, arm in zip(axes[3:], online):
        for d, w in table["arms"][arm]["weights"]["per_epoch"].items():
            ax.plot(range(1, len(w) + 1), w, label=d, lw=2 if d == RANDOM else 1.2)
        ax.set_title(f"{arm}: weights in force")
        ax.set_xlabel("epoch")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
