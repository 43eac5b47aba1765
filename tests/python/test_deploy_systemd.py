"""The systemd unit (deploy/systemd/samplerd.service): verified, hardened, and its command works.

`systemd-analyze verify` checks that the unit parses with no unknown or misspelt directive and
that the ExecStart program exists and is executable. The unit names the installed path
(/usr/local/bin/samplerd), which CI does not have, so the tests verify a copy whose ExecStart
names the binary under test instead; nothing else in the copy changes.
`systemd-analyze security --offline=yes` scores the sandboxing (0 best, 10 worst) without a
running systemd.
"""

import pathlib
import re
import shlex
import subprocess

import pytest

from conftest import ROOT, samplerd_binary

UNIT = ROOT / "deploy" / "systemd" / "samplerd.service"
GPU_DROP_IN = ROOT / "deploy" / "systemd" / "samplerd.service.d" / "gpu.conf"
INSTALLED_BINARY = "/usr/local/bin/samplerd"
MAX_EXPOSURE = 3.0


def copy_for_ci(tmp_path, text=None, gpu_drop_in=None):
    """The unit (and, if given, the text of its GPU drop-in, in samplerd.service.d/ beside it,
    where systemd-analyze looks for drop-ins of a unit given by path)."""
    text = UNIT.read_text() if text is None else text
    assert f"ExecStart={INSTALLED_BINARY} " in text
    path = tmp_path / "samplerd.service"
    path.write_text(text.replace(f"ExecStart={INSTALLED_BINARY} ",
                                 f"ExecStart={samplerd_binary()} "))
    if gpu_drop_in is not None:
        (tmp_path / "samplerd.service.d").mkdir()
        (tmp_path / "samplerd.service.d" / "gpu.conf").write_text(gpu_drop_in)
    return path


def verify(path):
    return subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True,
                          text=True, timeout=60)


def exposure(path):
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(path)],
                            capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    return float(match.group(1))


def test_unit_verifies_clean(tmp_path):
    result = verify(copy_for_ci(tmp_path))
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr)


def test_verify_reports_a_misspelt_directive_and_a_missing_binary(tmp_path):
    text = UNIT.read_text().replace("NoNewPrivileges=yes", "NoNewPrivilegs=yes")
    result = verify(copy_for_ci(tmp_path, text))
    assert "Unknown key 'NoNewPrivilegs'" in result.stdout + result.stderr
    result = verify(UNIT)  # As installed: /usr/local/bin/samplerd, absent here.
    assert result.returncode != 0 and "is not executable" in result.stdout + result.stderr


def test_unit_exposure_is_at_most_3(tmp_path):
    assert exposure(copy_for_ci(tmp_path)) <= MAX_EXPOSURE


def test_the_same_unit_without_its_hardening_is_exposed(tmp_path):
    text = UNIT.read_text()
    hardening = text.index("# Hardening")
    unhardened = text[:hardening] + text[text.index("[Install]"):]
    assert exposure(copy_for_ci(tmp_path, unhardened)) > MAX_EXPOSURE


def test_the_gpu_drop_in_verifies_clean_and_stays_hardened(tmp_path):
    path = copy_for_ci(tmp_path, gpu_drop_in=GPU_DROP_IN.read_text())
    result = verify(path)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr)
    assert exposure(path) <= MAX_EXPOSURE


def test_verify_reads_the_drop_in(tmp_path):
    """So the check above checks it: a misspelt directive in the drop-in is reported."""
    text = GPU_DROP_IN.read_text().replace("DevicePolicy=closed", "DevicePolicyy=closed")
    result = verify(copy_for_ci(tmp_path, gpu_drop_in=text))
    assert "Unknown key 'DevicePolicyy'" in result.stdout + result.stderr


def service_settings(*paths):
    """Directive -> values, of the unit and then the drop-ins in `paths` (values of a key given
    in several files accumulate, as systemd's list settings do; Environment= by variable)."""
    settings = {}
    for path in (UNIT, *paths):
        for line in path.read_text().splitlines():
            key, eq, value = line.partition("=")
            if eq and not line.startswith("#"):
                settings.setdefault(key, []).append(value)
    return settings


def environment_of(settings):
    return dict(shlex.split(e)[0].split("=", 1) for e in settings["Environment"])


def test_the_gpu_form_admits_exactly_the_nvidia_devices_and_asks_for_cuda():
    base, gpu = service_settings(), service_settings(GPU_DROP_IN)
    assert base["PrivateDevices"] == ["yes"]
    assert environment_of(base)["SAMPLERD_BACKEND"] == "--backend=cpu"  # Never a silent auto.
    assert gpu["PrivateDevices"][-1] == "no" and gpu["DevicePolicy"][-1] == "closed"
    assert environment_of(gpu)["SAMPLERD_BACKEND"] == "--backend=cuda"
    allowed = [value.split()[0] for value in gpu["DeviceAllow"]]
    assert allowed == ["char-nvidia-frontend", "char-nvidia-uvm", "char-nvidia-caps"]


def command_line(settings, state_dir):
    """ExecStart with ${STATE_DIRECTORY} and the $VARIABLES of Environment= expanded as systemd
    does (split at spaces)."""
    environment = environment_of(settings)
    help_text = subprocess.run([samplerd_binary(), "--help"], capture_output=True,
                               text=True).stdout
    argv = []
    for word in settings["ExecStart"][0].split():
        if word.startswith("$"):
            flags = environment[word[1:]].split()
            if "--plaintext " not in help_text and "--plaintext" in flags:
                flags.remove("--plaintext")  # An older binary: it has no such flag.
            argv += flags
        else:
            argv.append(word.replace("${STATE_DIRECTORY}", str(state_dir)))
    argv[0] = samplerd_binary()
    return argv


def test_the_gpu_form_fails_the_start_without_a_gpu(tmp_path):
    if pathlib.Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA device: the start would succeed")
    argv = command_line(service_settings(GPU_DROP_IN), tmp_path / "state")
    result = subprocess.run(argv + ["--port=0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'backend = "cuda"' in result.stderr and "listening" not in result.stdout


def test_defaults_bind_loopback_and_the_stop_timeout_covers_the_grace_period():
    settings = service_settings()
    default_flags = environment_of(settings)["SAMPLERD_FLAGS"].split()
    assert "--host=127.0.0.1" in default_flags
    grace_ms = int(re.search(r"--grace_period_ms=(\d+)", settings["ExecStart"][0]).group(1))
    stop_s = int(settings["TimeoutStopSec"][0])
    assert grace_ms / 1000 < stop_s <= grace_ms / 1000 + 60
    assert settings["StateDirectory"] == ["samplerd"]


def test_the_command_line_serves_as_systemd_expands_it(tmp_path):
    """ExecStart with ${STATE_DIRECTORY} and the default $SAMPLERD_FLAGS expanded as systemd
    does (split at spaces; $SAMPLERD_BACKEND too), --port=0 appended (the last --port wins) to pick a free port."""
    argv = command_line(service_settings(), tmp_path / "state")
    proc = subprocess.Popen(argv + ["--port=0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("samplerd listening on 127.0.0.1:"), line
        assert (tmp_path / "state" / "jobs").is_dir()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
