"""The samplerd demo: a local samplerd plus a 4-rank PyTorch DDP training (gloo, CPU), then the
weight policy that measured best against its natural baseline.

    python examples/ddp_demo.py --samplerd bazel-bin/server/samplerd --plot out/demo.png
    SAMPLERD_BIN=/path/to/samplerd python examples/ddp_demo.py       # or examples/run_demo.sh

Prints, per epoch: each rank's shard size, the overlap between ranks' shards, the effective
sample size of the weights, the minority share of the drawn samples, the loss and the balanced
accuracy; then compares, for the same number of steps from the same model, with what a user
would pick instead (a plain DistributedSampler, a per-rank WeightedRandomSampler with 1/count
weights, samplerd's class balance alone), says what class balance and the loss factor each
contributed, and writes a PNG of how the weights and the minority share evolved.

Then (examples/demo_measured.py) the policy that measured best: RHO-LOSS through samplerd
against a plain DistributedSampler, trained live on Fashion-MNIST with 20% wrong labels for
--compare_seeds paired seeds (steps to 90% and 97% of the DistributedSampler's final accuracy,
with the spread over the seeds; 0 seeds: skipped), the benchmark's figures for it read from
bench/results/, and where no loss policy helps (long-tailed classes with clean labels: class
balance alone).
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_train  # noqa: E402


def start_samplerd(binary):
    proc = subprocess.Popen([binary, "--plaintext", "--port=0", "--log_level=1"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("samplerd listening on "):
        proc.kill()
        sys.exit(f"samplerd did not start: {line!r}")
    return proc, line.split()[-1]


def overlap(shards):
    """Indices served to more than one rank in the epoch (0: the shards are disjoint)."""
    seen, repeated = set(), 0
    for shard in shards:
        for i in set(shard):
            repeated += i in seen
            seen.add(i)
    return repeated


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samplerd",
                        default=os.environ.get("SAMPLERD_BIN", "bazel-bin/server/samplerd"),
                        help="the samplerd binary (default: $SAMPLERD_BIN, else bazel-bin/...)")
    parser.add_argument("--plot", default="out/demo.png", help="where to write the PNG")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--num_workers", type=int, default=2,
                        help="DataLoader worker processes per rank")
    parser.add_argument("--compare_seeds", type=int, default=3,
                        help="paired seeds of the live comparison of RHO-LOSS through samplerd "
                             "with a DistributedSampler (0: skip it)")
    parser.add_argument("--compare_steps", type=int, default=0,
                        help="its training steps (0: examples/demo_measured.py's, 100 on "
                             "Fashion-MNIST)")
    args = parser.parse_args()
    if not os.access(args.samplerd, os.X_OK):
        sys.exit(f"samplerd binary not found at {args.samplerd}: run "
                 "`bazel build //server:samplerd`, or pass --samplerd / set SAMPLERD_BIN")

    proc, address = start_samplerd(args.samplerd)
    print(f"samplerd listening on {address}; training 4 DDP ranks (gloo, CPU) on {ddp_train.N} "
          f"samples, minority 1:{ddp_train.MAJORITY // ddp_train.MINORITY}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            report = ddp_train.run(address, os.path.join(tmp, "report.json"), epochs=args.epochs,
                                    num_workers=args.num_workers, alternatives=("wrs", "cb"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

    lo, hi = report["minority_ids"]
    print(f"\n{'epoch':>5}  {'shard size per rank':<20} {'overlap':>7} {'ESS':>7} "
          f"{'minority':>8} {'w_min/w_maj':>11} {'loss':>7} {'bal.acc':>7}")
    shares, ess = [], []
    for e in report["epochs"]:
        drawn = [i for s in e["shards"] for i in s]
        share = sum(lo <= i < hi for i in drawn) / max(1, len(drawn))
        shares.append(share)
        ess.append(e["ess"])
        sizes = " ".join(str(len(s)) for s in e["shards"])
        ratio = e["w_minority"] / e["w_majority"]
        print(f"{e['epoch']:>5}  {sizes:<20} {overlap(e['shards']):>7} {e['ess']:>7.0f} "
              f"{share:>8.3f} {ratio:>11.1f} {e['loss']:>7.3f} {e['balanced_accuracy']:>7.3f}")
    print("(overlap: indices drawn by more than one rank; ESS: effective sample size of the "
          f"weights, of N = {hi}; minority: share of the minority class in the drawn samples; "
          "w_min/w_maj: mean weight of drawn minority over majority samples)")
    final = report["final"]
    print(f"\nminority share of the data: {(hi - lo) / hi:.3f}; of the drawn samples (last epoch): "
          f"{shares[-1]:.3f}")
    print(f"mean weight of drawn minority / majority samples: {final['minority_weight']:.2f} / "
          f"{final['majority_weight']:.2f}; correlation of majority weights with their loss: "
          f"{final['majority_weight_loss_corr']:.2f}")
    uniform = report["baseline_balanced_accuracy"]
    wrs, cb = report["alternatives"]["wrs"], report["alternatives"]["cb"]
    cb_loss = report["epochs"][-1]["balanced_accuracy"]
    print(f"\nbalanced accuracy after {report['samplerd_steps']} steps, same initial model "
          f"(one seed: bench/RESULTS.md has the seed-to-seed spread):")
    for name, value in (("DistributedSampler (uniform)", uniform),
                        ("per-rank WeightedRandomSampler, 1/count", wrs),
                        ("samplerd class-balanced alone", cb),
                        ("samplerd class-balanced x loss (this run)", cb_loss)):
        print(f"  {name:<44} {value:.3f}")
    print(f"what each part contributed: class balance {cb - uniform:+.3f} (vs uniform), the loss "
          f"factor {cb_loss - cb:+.3f} (vs class balance alone); per-rank WeightedRandomSampler "
          f"vs samplerd class balance {wrs - cb:+.3f}.")
    draw(report, shares, ess, args.plot)

    import demo_measured  # The policy that measured best, and where none helps.
    root, ext = os.path.splitext(args.plot)
    if args.compare_seeds > 0:
        demo_measured.live(args.samplerd, args.compare_seeds, args.compare_steps,
                           plot=f"{root}_rho{ext}" if _has_matplotlib() else "")
    demo_measured.benchmark()
    demo_measured.none_helps(loss_factor_here=cb_loss - cb)


def draw(report, shares, ess, path):
    """The PNG of how the weights and the minority share evolved."""
    lo, hi = report["minority_ids"]

    # Optional (Debian's python3-matplotlib; pip: samplerd[demo]): the text is the report.
    if not _has_matplotlib():
        print(f"plot: not drawn ({path}): matplotlib is not installed "
              "(apt install python3-matplotlib, or pip install 'samplerd[demo]')")
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    epochs = [e["epoch"] for e in report["epochs"]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5.5))
    a1.plot(epochs, shares, "o-", label="minority share of drawn samples (samplerd)")
    a1.axhline((hi - lo) / hi, color="gray", ls="--",
               label="minority share of the data (= DistributedSampler)")
    a1.plot(epochs, [e["balanced_accuracy"] for e in report["epochs"]], "s-",
            label="balanced accuracy (samplerd)")
    a1.axhline(report["baseline_balanced_accuracy"], color="red", ls=":",
               label="balanced accuracy (DistributedSampler, same steps)")
    per_epoch = sum(len(s) for s in report["epochs"][0]["shards"])
    a1.axhline(min(1.0, ddp_train.MINORITY / per_epoch), color="gray", ls=":", lw=1,
               label="ceiling: every minority sample drawn (without replacement)")
    a1.set_xlabel("epoch")
    a1.set_ylim(0, 1)
    a1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    a1.set_title("What the 4 ranks drew, and what the model learned")
    a2.semilogy(epochs, [e["w_minority"] for e in report["epochs"]], "o-", color="tab:orange",
                label="mean weight, drawn minority samples")
    a2.semilogy(epochs, [e["w_majority"] for e in report["epochs"]], "o-", color="tab:blue",
                label="mean weight, drawn majority samples")
    a2.semilogy(epochs, [e["w_max"] for e in report["epochs"]], "^:", color="tab:red",
                label="max weight")
    a2.semilogy(epochs, [e["w_min"] for e in report["epochs"]], "v:", color="tab:green",
                label="min weight")
    a2.set_xlabel("epoch")
    a2.set_ylabel("weight / mean weight")
    a2b = a2.twinx()
    a2b.plot(epochs, ess, "k--", label="effective sample size (right)")
    a2b.set_ylabel("effective sample size (sum w)^2 / sum w^2")
    a2b.set_ylim(0, max(ess) * 1.1)
    lines = a2.get_legend_handles_labels()
    lines_b = a2b.get_legend_handles_labels()
    a2.legend(lines[0] + lines_b[0], lines[1] + lines_b[1], fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.13), ncol=2)
    for a in (a1, a2):
        a.xaxis.get_major_locator().set_params(integer=True)
    a2.set_title("How the weights evolved (class-balanced x loss)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
