"""The README's first command ends with examples/ddp_demo.py: shards and weights of a 4-rank
training, then the policy that measured best against its natural baseline (live, paired seeds,
with the spread; and the benchmark's figures read from bench/results/), and where none helps.

The demo runs end to end here, shortened (2 epochs; the live comparison 2 seeds of 30 steps),
with the real samplerd binary and real DDP ranks; the benchmark's figures it prints are
checked against bench/RESULTS.md's tables (which the same JSON files produced)."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, samplerd_binary

pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "examples"))
import demo_measured  # noqa: E402


def test_the_benchmark_figures_are_read_from_the_checked_in_results(capsys):
    table = demo_measured.benchmark()
    out = capsys.readouterr().out
    assert demo_measured.RHO_RESULTS in out
    # bench/RESULTS.md, "RHO-LOSS through samplerd on Fashion-MNIST": rho_samplerd vs uniform.
    noisy, clean = out.split(" fmnist (clean):")
    assert "median 40 vs 120, paired -96 ± 52 (5/5 seeds fewer)" in noisy
    assert "0.803 vs 0.789, paired +0.014 ± 0.016 (3/5 seeds better)" in noisy
    assert "median 60 vs 120, paired -84 ± 48 (5/5 seeds fewer)" in clean
    assert "0.824 vs 0.813, paired +0.011 ± 0.006 (5/5 seeds better)" in clean
    assert table["fmnist_noisy"]["arms"]["rho_samplerd"]["seeds"] == 5


def test_where_none_helps_is_the_long_tail_with_its_figures(capsys):
    t = demo_measured.none_helps(loss_factor_here=-0.04)
    out = capsys.readouterr().out
    # bench/RESULTS.md, "Fashion-MNIST (4 seeds)", fmnist_lt, and "What this says".
    assert "class balance alone +0.044 ± 0.015 (4/4 seeds better)" in out
    assert "97% of its final in 60 instead of 140 steps" in out
    assert "samplerd LOSS (the loss factor): -0.047 ± 0.013 (0/4 seeds better) against class " \
           "balance alone" in out
    assert "RHO-LOSS in the trainer: -0.018 ± 0.009 (0/4 seeds better)" in out
    assert "this demo's loss factor (class balance x LOSS, one seed, above): -0.040" in out
    assert t["arms"]["cb"]["seeds"] == 4


def test_a_missing_results_file_is_said_not_a_crash(capsys):
    assert demo_measured.benchmark(rho_path="bench/results/absent.json") is None
    assert demo_measured.none_helps(first_path="bench/results/absent.json") is None
    out = capsys.readouterr().out
    assert out.count("(bench/results/absent.json is not in this checkout)") == 2


def test_the_demo_runs_end_to_end(tmp_path):
    plot = tmp_path / "demo.png"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ddp_demo.py"), "--samplerd", samplerd_binary(),
         "--epochs", "2", "--num_workers", "0", "--compare_seeds", "2", "--compare_steps", "30",
         "--plot", str(plot)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # Part 1: shards and weights per epoch (the table), what each part contributed.
    assert "shard size per rank" in out and "what each part contributed" in out
    assert len([line for line in out.splitlines() if line.startswith("    1  ")]) == 1
    # Part 2: the live comparison, each figure paired over the 2 seeds.
    live = out[out.index("RHO-LOSS through samplerd vs DistributedSampler, live:"):
               out.index("The benchmark:")]
    assert "30 steps" in live and "2 paired seeds" in live
    for what in ("steps to 90%", "steps to 97%", "final balanced accuracy"):
        line = next(x for x in live.splitlines() if x.strip().startswith(what))
        assert "/2 seeds" in line and "±" in line, line
    # Part 3: the benchmark's figures and where none helps.
    assert "paired -96 ± 52 (5/5 seeds fewer)" in out
    assert "Where no loss policy helps: long-tailed classes with clean labels" in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert plot.stat().st_size > 0
    assert (tmp_path / "demo_rho.png").stat().st_size > 0
