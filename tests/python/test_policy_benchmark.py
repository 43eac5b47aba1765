"""The policy benchmark (bench/policy_benchmark.py) in its smoke configuration: every arm trains
with 2 real DDP ranks (gloo) on real data (digits with 20% wrong labels), the samplerd arms
through the real binary, and the steps-to-target summary, the tables and the plot come out.
Not the measurement itself (minutes: bench/RESULTS.md). The Fashion-MNIST loader is checked
against Debian's package where it is installed."""

import os
import sys

import numpy as np
import pytest

from conftest import samplerd_binary

pytest.importorskip("sklearn", reason="python3-sklearn (tools/install_deps.sh) is not installed")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import policy_benchmark  # noqa: E402  (first: it puts client/python on the path)
import policy_arms  # noqa: E402,I100
import policy_data  # noqa: E402
import policy_report  # noqa: E402


def test_every_arm_trains_and_the_summary_pairs_it_with_uniform(tmp_path):
    cfg = dict(policy_benchmark.PRESETS["smoke"])
    results, skipped = policy_benchmark.run(samplerd_binary(), verbose=False, **cfg)
    # An arm is skipped only with a reason: an API of issue 34 this client lacks. Where the
    # client has it, the arm must run (a refusal by the server is a failure here).
    import inspect
    import samplerd
    from samplerd.torch import DistributedWeightedSampler
    params = inspect.signature(DistributedWeightedSampler.__init__).parameters
    has = {"rho_sd": hasattr(samplerd.Client, "upload_irreducible_losses"),
           "loss_is": "importance_weights" in params,
           "rho_samplerd": "irreducible_losses" in params,
           "rho_sd_cand": "irreducible_losses" in params}
    assert set(skipped) == {arm for arm, there in has.items() if not there}, skipped
    assert all(skipped.values())
    ran = [a for a in policy_benchmark.ARMS if a not in skipped]
    assert [r["arm"] for r in results] == ran
    steps = list(range(cfg["eval_every"], cfg["steps"] + 1, cfg["eval_every"]))
    for r in results:
        assert [s for s, _ in r["curve"]] == steps
        assert all(0.0 <= m <= 1.0 for _, m in r["curve"])
        assert len(r["recalls"]) == 10 and r["tail"] == [7, 8, 9]
        # Uniform-like arms draw the wrong labels at about their 20% share (320 draws).
        if r["arm"] in ("uniform", "cb", "wrs"):
            assert 0.1 < r["noisy_share"] < 0.3, r
    by = {r["arm"]: r for r in results}
    # RHO-LOSS selects by loss minus irreducible loss: mislabelled samples have a high
    # irreducible loss, so it draws them less than uniform does (0.05 vs 0.20 here; a wrong
    # sign or missing irreducible losses would draw them more).
    assert by["rho"]["noisy_share"] < 0.5 * by["uniform"]["noisy_share"]
    # So does the same selection through samplerd (the irreducible losses streamed with the
    # candidates): a stream without them, or misaligned ones, would select at random.
    for arm in {"rho_samplerd", "rho_sd_cand"} - set(skipped):
        assert by[arm]["noisy_share"] < 0.5 * by["uniform"]["noisy_share"], by[arm]
    assert by["rho"]["il_model_bal_acc"] > 0.3  # The holdout model learnt something.

    table = policy_report.summarise(results)["digits_noisy"]
    uniform_final = policy_report.final_value(by["uniform"]["curve"])
    assert table["targets"] == pytest.approx([f * uniform_final
                                              for f in policy_report.TARGET_FRACTIONS])
    assert [t["reached"] for t in table["arms"]["uniform"]["targets"]] == [1, 1]
    for arm in ran:
        final = table["arms"][arm]["vs"]["uniform"]["final"]
        assert final["n"] == 1
        assert final["mean"] == pytest.approx(
            np.mean([m for _, m in by[arm]["curve"][-3:]]) - uniform_final)
    text = policy_report.markdown({"digits_noisy": table}, ran)
    assert all(f"| {arm} |" in text for arm in ran)
    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed")
    png = tmp_path / "curves.png"
    policy_report.plot(results, {"digits_noisy": table}, ran, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_steps_to_target_counts_unreached_runs_past_their_last_step():
    curve = [[10, 0.5], [20, 0.8], [30, 0.9]]
    assert policy_report.steps_to(curve, 0.8) == 20
    assert policy_report.steps_to(curve, 0.95) is None
    results = [{"dataset": "d", "seed": s, "arm": a, "curve": c, "recalls": [0.0, 1.0],
                "tail": [1], "seconds": 1.0}
               for s in range(2)
               for a, c in (("uniform", curve), ("fast", [[10, 0.9], [20, 0.9], [30, 0.9]]),
                            ("slow", [[10, 0.1], [20, 0.1], [30, 0.1]]))]
    table = policy_report.summarise(results)["d"]
    fast, slow = table["arms"]["fast"], table["arms"]["slow"]
    # uniform's final value: the mean of its last 3 evaluations, 0.733. Target 90% of it
    # (0.66): uniform reaches it at 20, fast at 10 (10 fewer, on both seeds); 97% (0.711):
    # the same steps.
    assert table["targets"] == pytest.approx([0.66, 0.97 * 2.2 / 3])
    assert fast["vs"]["uniform"]["steps"][0] == {"mean": -10.0, "sd": 0.0, "wins": 2,
                                                 "ties": 0, "n": 2}
    assert fast["vs"]["uniform"]["final"]["mean"] == pytest.approx(0.9 - 2.2 / 3)
    assert slow["targets"][0]["reached"] == 0
    assert slow["vs"]["uniform"]["steps"][0]["mean"] == 20.0  # 40 (unreached) - 20


def test_fashion_mnist_splits_from_debians_package():
    reason = policy_data.available("fmnist")
    if reason:
        pytest.skip(reason)
    clean = policy_data.make_dataset("fmnist", 1000)
    assert clean.x.shape == (50000, 196) and clean.x_hold.shape == (10000, 196)
    assert clean.x_test.shape == (2000, 196)  # 14x14 images, 200 test images per class
    assert np.bincount(clean.y_test.numpy()).tolist() == [200] * 10
    assert np.bincount(clean.y.numpy()).tolist() == [5000] * 10
    assert not clean.noisy.any()
    lt = policy_data.make_dataset("fmnist_lt", 1000)
    assert np.bincount(lt.y.numpy()).tolist() == policy_data.long_tail_counts(5000, 10, 50)
    assert lt.tail == [7, 8, 9]
    noisy = policy_data.make_dataset("fmnist_noisy", 1000)
    assert 0.19 < float(noisy.noisy.float().mean()) < 0.21
    wrong = noisy.y != clean.y  # Same seed, same split: exactly the flipped labels differ.
    assert bool((wrong == noisy.noisy).all())
    assert policy_arms.make_model(0, 196, 10)(clean.x[:2]).shape == (2, 10)


def policies_snippet(heading):
    """The first ```python block after `heading` in docs/POLICIES.md."""
    import re
    text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                             "POLICIES.md")).read()
    return re.search(r"```python\n(.*?)```", text[text.index(heading):], re.S).group(1)


def test_the_docs_irreducible_loss_snippet_scores_wrong_labels_high():
    import torch
    from torch.utils.data import TensorDataset
    data = policy_data.make_dataset("digits_noisy", 1000)
    scope = {}
    exec(policies_snippet("## Irreducible losses"), scope)  # noqa: S102 -- the doc, as written
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    losses = scope["irreducible_losses"](model, TensorDataset(data.x_hold, data.y_hold),
                                         TensorDataset(data.x, data.y))
    assert losses.shape == (len(data.y),) and bool(torch.isfinite(losses).all())
    assert float(losses.min()) >= 0.0
    # A model that never saw the training set still knows the true classes: the samples whose
    # label was replaced get a higher irreducible loss than the others (2.57 vs 1.41 here,
    # from a 300-image holdout with 20% wrong labels itself).
    assert float(losses[data.noisy].mean()) > 1.5 * float(losses[~data.noisy].mean())


@pytest.mark.parametrize("name", policy_data.SKLEARN_SETS)
def test_every_quick_set_splits_for_every_seed(name):
    for seed in range(1000, 1005):
        data = policy_data.make_dataset(name, seed)
        counts = np.bincount(data.y_test.numpy(), minlength=data.classes)
        assert len(set(counts.tolist())) == 1  # A balanced test set.
        assert len(data.y_hold) > 0 and len(data.x) == len(data.y) == len(data.noisy)
