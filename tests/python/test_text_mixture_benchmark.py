"""The text-mixture benchmark (bench/text_mixture_benchmark.py) in its smoke configuration: every
arm trains the byte-level model with 2 real DDP ranks (gloo) on real text domains of this
machine plus random bytes, each arm a mixture job of the real samplerd binary; the windows hold
the shares the weights say, the online arms' weights move, and the tables and the plot come
out. Not the measurement itself (minutes: bench/RESULTS.md)."""

import os
import sys

import numpy as np
import pytest

from conftest import samplerd_binary

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import text_mixture_benchmark as bench  # noqa: E402  (first: it puts client/python on the path)
import text_mixture_data as tdata  # noqa: E402,I100
import text_mixture_report as treport  # noqa: E402


def test_every_arm_trains_on_the_weights_its_job_serves(tmp_path):
    cfg = dict(bench.PRESETS["smoke"])
    domains, results, skipped = bench.run(samplerd_binary(), verbose=False, **cfg)
    names = list(domains)
    assert "random" in names and len(names) >= 3, domains
    # The online arms are skipped only where this client has no online weights; where it has
    # them, the arms must run (a refusal by the server is a failure here).
    from samplerd._proto import samplerd_pb2 as pb
    has_online = "rule" in pb.MixtureSpec.DESCRIPTOR.fields_by_name
    assert set(skipped) == (set() if has_online else {"excess", "exp3"}), skipped
    assert [r["arm"] for r in results] == [a for a in bench.ARMS if a not in skipped]
    by = {r["arm"]: r for r in results}
    sizes = np.array([domains[n]["train_chunks"] for n in names], float)
    reference = by["uniform"]["curve"][-1][1]
    expected = {"uniform": np.full(len(names), 1.0 / len(names)), "prop": sizes / sizes.sum()}
    hand = np.array(bench.hand_weights(names, reference))
    expected["hand"] = hand / hand.sum()
    epochs, window = cfg["epochs"], cfg["window"]
    for r in results:
        assert [s for s, _ in r["curve"]] == [e * window // (cfg["world"] * cfg["batch_size"])
                                              for e in range(cfg["eval_every"], epochs + 1,
                                                             cfg["eval_every"])]
        final = r["curve"][-1][1]
        assert list(final) == names
        # Random bytes cannot be predicted (ln 256 = 5.545 nats); the text domains are learnt
        # well below it in a few hundred chunks (about 3.6 here).
        assert final["random"] > 5.4, r
        assert np.mean(treport.learnable(final)) < 4.8, r
        drawn = np.array(r["drawn"])
        assert drawn.shape == (epochs, len(names)) and (drawn.sum(axis=1) == window).all()
        weights = np.array([[w[n] for n in names] for w in r["weights"]])
        assert weights.shape == (epochs, len(names))
        assert np.allclose(weights.sum(axis=1), 1.0)
        if r["arm"] in expected:
            # Static weights: the served weight each epoch, and the drawn counts within one
            # sample of their target over every prefix of the run (the apportionment).
            assert np.allclose(weights, expected[r["arm"]]), r["arm"]
            targets = np.outer(np.arange(1, epochs + 1), window * expected[r["arm"]])
            assert np.abs(np.cumsum(drawn, axis=0) - targets).max() < 1.0, r["arm"]
        else:
            # Online: uniform at first; the rule has moved them by the last epoch (the first
            # epoch's losses only start each group's loss average).
            assert np.allclose(weights[0], 1.0 / len(names)), r["arm"]
            assert np.abs(weights[-1] - weights[0]).max() > 1e-4, (r["arm"], weights)
    assert by["hand"]["weights"][0]["random"] == pytest.approx(bench.HAND_RANDOM_SHARE)

    table = treport.summarise(results)
    assert set(table["arms"]) == set(by)
    prop = np.mean(treport.learnable(by["prop"]["curve"][-1][1]))
    assert table["target"] == pytest.approx(prop * (1 + treport.TARGET_MARGIN))
    assert table["arms"]["prop"]["reached"] == 1
    text = treport.markdown(table)
    assert all(f"| {arm} |" in text for arm in by)
    pytest.importorskip("matplotlib", reason="python3-matplotlib is not installed")
    png = tmp_path / "text.png"
    treport.plot(results, table, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _run(arm, seed, curve, weights=None):
    names = ["a", "b", "random"]
    return {"arm": arm, "seed": seed, "seconds": 1.0, "reference": None,
            "curve": [[s, dict(zip(names, v))] for s, v in curve],
            "weights": weights or [dict(zip(names, [0.4, 0.4, 0.2]))] * 2,
            "drawn": [[4, 4, 2], [4, 4, 2]]}


def test_summary_targets_steps_and_paired_differences():
    results = []
    for seed in range(2):
        results.append(_run("prop", seed, [(10, [3.0, 4.0, 5.6]), (20, [2.0, 3.0, 5.6])]))
        # Reaches prop's final mean (2.5) + 5% = 2.625 at step 10; better on both seeds.
        results.append(_run("fast", seed, [(10, [2.0, 3.0, 5.6]), (20, [1.5, 2.5, 5.6])]))
        # Never reaches it: counted at step 30 (one interval past its last evaluation).
        results.append(_run("slow", seed, [(10, [4.0, 5.0, 5.6]), (20, [3.0, 3.5 + seed, 5.6])]))
    table = treport.summarise(results, baseline="prop")
    assert table["target"] == pytest.approx(2.625)
    fast, slow = table["arms"]["fast"], table["arms"]["slow"]
    assert fast["vs"]["mean"] == {"mean": -0.5, "sd": 0.0, "wins": 2, "ties": 0, "n": 2}
    assert fast["vs"]["steps"]["mean"] == -10.0 and fast["median_steps"] == 10.0
    assert table["arms"]["prop"]["median_steps"] == 20.0
    assert slow["reached"] == 0 and slow["vs"]["steps"]["mean"] == 10.0
    assert slow["worst"] == pytest.approx(4.0) and slow["worst_domain"] == "b"
    assert slow["vs"]["worst"]["wins"] == 0 and slow["vs"]["worst"]["sd"] == pytest.approx(
        np.std([0.5, 1.5], ddof=1))
    assert table["arms"]["fast"]["weights"]["drawn_share"] == pytest.approx(
        {"a": 0.4, "b": 0.4, "random": 0.2})


def test_every_domain_splits_into_disjoint_chunks():
    for name in tdata.DOMAINS:
        why = tdata.available(name)
        if why:
            pytest.skip(why)
        d = tdata.split(name, tdata.domain_text(name, 10 * tdata.BLOCK))
        # 10 blocks: block 7 held out, 9 trained on.
        assert d.train.shape == (9 * tdata.BLOCK // tdata.CHUNK, tdata.CHUNK)
        assert d.held.shape == (tdata.BLOCK // tdata.CHUNK, tdata.CHUNK)
        held = {bytes(c) for c in d.held}
        # No held-out chunk is trained on (a repeated chunk of text aside: licence boilerplate).
        assert sum(bytes(c) in held for c in d.train) < 0.05 * len(d.train), name
    random = tdata.domain_text("random", 1000)
    assert random == tdata.domain_text("random", 1000) and len(set(random)) > 200
