"""--backend at startup, from the real binary: cuda without a usable GPU fails naming what is
missing; auto falls back to the CPU and logs why; bad values are refused naming the flag.

On a machine with a usable GPU the no-GPU cases skip (the GPU machine runs the CUDA backend
through tools/gpu/check.sh instead).
"""

import shutil

import pytest

from conftest import run_samplerd_expecting_failure
from test_logs import find, run_and_log

no_gpu = pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                            reason="an NVIDIA driver is installed here: the no-GPU cases do not "
                                   "apply (tools/gpu/check.sh tests the CUDA backend)")


@no_gpu
def test_cuda_without_a_gpu_fails_at_startup_naming_what_is_missing():
    rc, stderr = run_samplerd_expecting_failure("--backend=cuda", timeout=20)
    assert rc == 1, stderr
    assert 'FAILED_PRECONDITION: backend = "cuda": ' in stderr, stderr
    # The runtime's own verdict: no driver here (or no device where a driver is installed).
    assert ("no NVIDIA driver" in stderr or "no CUDA device" in stderr), stderr
    assert "cudaGetDeviceCount" in stderr, stderr
    assert "use --backend=cpu" in stderr, stderr


@no_gpu
def test_auto_without_a_gpu_serves_on_the_cpu_and_says_why():
    def drive(client):
        client.create_job("j", 1000, 1)
        assert client.status("j").backend == "cpu"

    events, text = run_and_log(["--backend=auto"], drive)
    chosen = find(events, "backend_selected")
    assert len(chosen) == 1, text
    assert chosen[0]["backend"] == "cpu"
    assert "no usable GPU" in chosen[0]["reason"], chosen[0]


def test_cpu_is_used_without_asking_the_gpu():
    def drive(client):
        client.create_job("j", 1000, 1)
        assert client.status("j").backend == "cpu"

    events, text = run_and_log(["--backend=cpu"], drive)
    assert not find(events, "backend_selected"), text


@pytest.mark.parametrize("flag, message", [
    ("--backend=gpu", 'INVALID_ARGUMENT: backend = "gpu": expected auto, cpu or cuda'),
    ("--cuda_device=-1", "INVALID_ARGUMENT: cuda_device = -1: must be >= 0"),
])
def test_bad_backend_flags_are_refused_naming_them(flag, message):
    rc, stderr = run_samplerd_expecting_failure(flag, timeout=20)
    assert rc == 1, stderr
    assert message in stderr, stderr
