"""The policy benchmark's summary (bench/policy_benchmark.py): steps to a target, paired
differences over seeds, Markdown tables and a plot.

An arm's final value is the mean of its last FINAL_EVALS evaluations (a single evaluation of a
small model trained with momentum moves by +-0.02 from one to the next). Targets are set from
the uniform baseline: TARGET_FRACTIONS of the mean over seeds of uniform's final value on that
data set. An arm's steps to a target is the first evaluation
step at which its test balanced accuracy reached it; a run that never did counts as one
evaluation interval past its last step for the paired difference (a lower bound: the tables
give the reached count beside it).
"""

import numpy as np

TARGET_FRACTIONS = (0.90, 0.97)
FINAL_EVALS = 3


def final_value(curve):
    """The mean of the curve's last FINAL_EVALS metrics."""
    return float(np.mean([m for _, m in curve[-FINAL_EVALS:]]))


def steps_to(curve, target):
    """The first step of `curve` ([[step, metric], ...]) with metric >= target, else None."""
    for step, metric in curve:
        if metric >= target:
            return step
    return None


def _paired(values, base, lower_is_better=False):
    """Paired difference arm - base over the seeds both have: mean, sd, wins, ties, n."""
    seeds = sorted(set(values) & set(base))
    if not seeds:
        return None
    d = np.array([values[s] - base[s] for s in seeds], dtype=float)
    better = d < 0 if lower_is_better else d > 0
    return {"mean": float(d.mean()), "sd": float(d.std(ddof=1)) if len(d) > 1 else 0.0,
            "wins": int(better.sum()), "ties": int((d == 0).sum()), "n": len(seeds)}


def summarise(results, baselines=("uniform",)):
    """Per data set: the targets and, per arm, the means over seeds and the paired differences
    from each baseline (final balanced accuracy; steps to each target)."""
    table = {}
    for dataset in dict.fromkeys(r["dataset"] for r in results):
        rows = [r for r in results if r["dataset"] == dataset]
        uniform_final = [final_value(r["curve"]) for r in rows if r["arm"] == "uniform"]
        if not uniform_final:
            raise ValueError(f"{dataset}: no uniform run, the targets are set from it")
        targets = [f * float(np.mean(uniform_final)) for f in TARGET_FRACTIONS]
        by = {}
        for r in rows:
            # Unreached: one evaluation interval past the last step (a lower bound).
            past = r["curve"][-1][0] + (r["curve"][-1][0] - r["curve"][-2][0]
                                        if len(r["curve"]) > 1 else 1)
            reached = [steps_to(r["curve"], t) for t in targets]
            by.setdefault(r["arm"], {})[r["seed"]] = {
                "final": final_value(r["curve"]),
                "tail": float(np.mean([r["recalls"][c] for c in r["tail"]])),
                "reached": reached,
                "steps": [s if s is not None else past for s in reached],
                "noisy_share": r.get("noisy_share"),
                "seconds": r["seconds"]}
        arms = {}
        for arm, per_seed in by.items():
            seeds = sorted(per_seed)
            final = np.array([per_seed[s]["final"] for s in seeds])
            e = {"seeds": len(seeds), "final": float(final.mean()),
                 "final_sd": float(final.std(ddof=1)) if len(final) > 1 else 0.0,
                 "tail": float(np.mean([per_seed[s]["tail"] for s in seeds])),
                 "seconds": float(np.mean([per_seed[s]["seconds"] for s in seeds])),
                 "targets": []}
            shares = [per_seed[s]["noisy_share"] for s in seeds
                      if per_seed[s]["noisy_share"] is not None]
            e["noisy_share"] = float(np.mean(shares)) if shares else None
            for k in range(len(targets)):
                reached = [per_seed[s]["reached"][k] for s in seeds
                           if per_seed[s]["reached"][k] is not None]
                e["targets"].append({
                    "reached": len(reached),
                    "median": float(np.median(reached)) if reached else None,
                    "mean_censored": float(np.mean([per_seed[s]["steps"][k] for s in seeds]))})
            e["vs"] = {}
            for b in baselines:
                if b not in by:
                    continue
                base = by[b]
                e["vs"][b] = {
                    "final": _paired({s: per_seed[s]["final"] for s in seeds},
                                     {s: base[s]["final"] for s in base}),
                    "steps": [_paired({s: per_seed[s]["steps"][k] for s in seeds},
                                      {s: base[s]["steps"][k] for s in base},
                                      lower_is_better=True) for k in range(len(targets))]}
            arms[arm] = e
        table[dataset] = {"targets": targets, "arms": arms}
    return table


def _diff(p, fmt):
    if p is None:
        return "—"
    ties = f", {p['ties']} tied" if p["ties"] else ""
    return f"{p['mean']:{fmt}} ± {p['sd']:{fmt.lstrip('+')}} ({p['wins']}/{p['n']} better{ties})"


def markdown(table, order, baseline="uniform"):
    """Per data set a table: final balanced accuracy and steps to each target, each with the
    paired difference from `baseline` (mean ± sd over seeds, and on how many seeds the arm
    was better)."""
    lines = []
    for dataset, t in table.items():
        tg = ", ".join(f"{f:.0%} = {v:.3f}" for f, v in zip(TARGET_FRACTIONS, t["targets"]))
        lines.append(f"\n**{dataset}** (targets: balanced accuracy at {tg} of uniform's final; "
                     f"differences paired with `{baseline}`)\n")
        head = ["arm", "final bal. acc (mean ± sd)", f"Δ final vs {baseline}"]
        for f in TARGET_FRACTIONS:
            head += [f"reached {f:.0%}", f"median steps to {f:.0%}",
                     f"Δ steps to {f:.0%} vs {baseline}"]
        head += ["tail-3 acc"]
        noisy = any(e["noisy_share"] for e in t["arms"].values())
        if noisy:
            head.append("mislabelled share of draws")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for arm in [a for a in order if a in t["arms"]]:
            e = t["arms"][arm]
            vs = e["vs"].get(baseline) if arm != baseline else None
            row = [arm, f"{e['final']:.3f} ± {e['final_sd']:.3f}",
                   _diff(vs["final"], "+.3f") if vs else "—"]
            for k, tk in enumerate(e["targets"]):
                row += [f"{tk['reached']}/{e['seeds']}",
                        f"{tk['median']:.0f}" if tk["median"] is not None else "-",
                        _diff(vs["steps"][k], "+.0f") if vs else "—"]
            row.append(f"{e['tail']:.3f}")
            if noisy:
                row.append(f"{e['noisy_share']:.3f}" if e["noisy_share"] is not None else "-")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(results, table, order, path):
    """One panel per data set: each arm's test balanced accuracy over the steps (mean over
    seeds), and the targets."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    datasets = list(table)
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        for arm in [a for a in order if a in table[dataset]["arms"]]:
            curves = [r["curve"] for r in results if r["dataset"] == dataset and r["arm"] == arm]
            steps = [s for s, _ in curves[0]]
            mean = np.mean([[m for _, m in c] for c in curves], axis=0)
            ax.plot(steps, mean, label=arm, lw=2 if arm == "uniform" else 1.2)
        for f, v in zip(TARGET_FRACTIONS, table[dataset]["targets"]):
            ax.axhline(v, color="grey", ls=":", lw=0.8)
            ax.text(0, v, f" {f:.0%}", va="bottom", fontsize=7, color="grey")
        ax.set_title(dataset)
        ax.set_xlabel("step")
        ax.set_ylabel("test balanced accuracy (mean over seeds)")
        top = max(table[dataset]["targets"])
        ax.set_ylim(max(0.0, top - 0.4), min(1.0, top + 0.1))
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
