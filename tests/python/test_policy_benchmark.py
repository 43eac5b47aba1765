"""The policy benchmark's smoke mode (bench/policy_benchmark.py): every arm trains a few steps
with 4 real DDP ranks (gloo) on real data, the samplerd arms through the real binary, and the
paired summary comes out. Not the measurement itself (minutes: bench/RESULTS.md)."""

import os
import sys

import pytest

from conftest import samplerd_binary

pytest.importorskip("sklearn", reason="python3-sklearn (tools/install_deps.sh) is not installed")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import policy_benchmark  # noqa: E402


def test_every_arm_runs_and_pairs_with_class_balance():
    results = policy_benchmark.run(samplerd_binary(), datasets=["digits_lt"], seeds=1, steps=10,
                                   eval_every=5, verbose=False)
    assert sorted(r["arm"] for r in results) == sorted(policy_benchmark.ARMS)
    for r in results:
        assert len(r["recalls"]) == 10 and all(0.0 <= x <= 1.0 for x in r["recalls"])
        assert r["tail"] == [7, 8, 9]  # The three rarest digits of the long tail.
    table = policy_benchmark.summarise(results)["digits_lt"]
    assert table["cb_loss_groups"]["paired"] == 1
    assert "cb_loss_groups" in policy_benchmark.markdown({"digits_lt": table})
