"""deploy/slurm/train.sbatch run for real, with stand-ins for Slurm's srun and scontrol.

No Slurm runs here, so `srun` is a small program that starts a step's tasks on this machine
with the variables Slurm gives each task (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS) and
forwards SIGTERM to them, as srun does; `scontrol show hostnames` prints the node list. The
server and the health check are real. The trainer records what it saw when it started: its
rank variables and whether samplerd already answered SERVING, so the test shows the ordering.
Also: shellcheck passes on every shell script in deploy/ and tools/.
"""

import fcntl
import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest

from conftest import ROOT, samplerd_binary

SBATCH = ROOT / "deploy" / "slurm" / "train.sbatch"

SRUN = r'''#!PYTHON
"""srun stand-in: runs the step's tasks here; forwards SIGTERM; exits with the worst status."""
import os, signal, subprocess, sys
args, ntasks = sys.argv[1:], int(os.environ["SLURM_NTASKS"])
while args and args[0].startswith("--"):
    option = args.pop(0)
    if option.startswith("--ntasks="):
        ntasks = int(option.split("=", 1)[1])
    assert option.split("=")[0] in ("--nodes", "--ntasks", "--nodelist", "--overlap",
                                    "--gres", "--kill-on-bad-exit"), option
tasks = [subprocess.Popen(args, env={**os.environ, "SLURM_PROCID": str(i),
                                     "SLURM_LOCALID": str(i), "SLURM_NTASKS": str(ntasks)})
         for i in range(ntasks)]
signal.signal(signal.SIGTERM, lambda *_: [t.send_signal(signal.SIGTERM) for t in tasks])
sys.exit(max(abs(t.wait()) for t in tasks))
'''

SCONTROL = r'''#!/bin/sh
[ "$1 $2" = "show hostnames" ] && echo "$3" | tr ',' '\n'
'''

TRAINER = r'''
import json, os, sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SAMPLERD_ADDRESS",
         "SAMPLERD_CA", "SAMPLERD_CLIENT_CERT")
seen = {name: os.environ.get(name) for name in names}
seen["has_token"] = bool(os.environ.get("SAMPLERD_TOKEN"))
def read(variable):
    path = os.environ.get(variable)
    return open(path, "rb").read() if path else None
# As samplerd's clients do: TLS with what the environment names.
address = seen["SAMPLERD_ADDRESS"] or "unset:1"
channel = (grpc.insecure_channel(address) if os.environ.get("SAMPLERD_PLAINTEXT") == "1" else
           grpc.secure_channel(address, grpc.ssl_channel_credentials(
               read("SAMPLERD_CA"), read("SAMPLERD_CLIENT_KEY"), read("SAMPLERD_CLIENT_CERT"))))
# No waiting and no retry: the server must already serve when a trainer starts.
with channel:
    try:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5)
        seen["health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    except grpc.RpcError as error:
        seen["health"] = error.code().name
    # An admin call (ListJobs, an empty request) with the token the script exported, and
    # without one.
    list_jobs = channel.unary_unary("/samplerd.v1.Sampler/ListJobs")
    for key, metadata in (("with_token", [("authorization",
                                           "Bearer " + os.environ.get("SAMPLERD_TOKEN", ""))]),
                          ("without_token", None)):
        try:
            list_jobs(b"", timeout=5, metadata=metadata)
            seen[key] = "OK"
        except grpc.RpcError as error:
            seen[key] = error.code().name
out = sys.argv[1]
with open(os.path.join(out, f"rank-{seen['RANK']}.json"), "w") as f:
    json.dump(seen, f)
'''


@pytest.fixture
def slurm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN.replace("PYTHON", sys.executable)),
                       ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    (tmp_path / "trainer.py").write_text(TRAINER)
    out = tmp_path / "out"
    out.mkdir()
    env = {
        # The venv's python3 first: the script's health check runs `python3`.
        "PATH": f"{bin_dir}:{pathlib.Path(sys.executable).parent}:/usr/bin:/bin",
        "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS": "3",
        "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_NAME": "run1",
        "SAMPLERD_BIN": samplerd_binary(),
        "SAMPLERD_START_TIMEOUT": "30",
    }

    def run(**extra):
        return subprocess.run(["bash", str(SBATCH), sys.executable, str(tmp_path / "trainer.py"),
                               str(out)], env={**env, **extra}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    return run, out, tmp_path / "samplerd-state" / "run1"


def lock_is_free(data_dir):
    """samplerd holds an exclusive flock on DATA_DIR/LOCK while it runs."""
    with open(data_dir / "LOCK") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False


def test_trainers_start_after_the_server_serves_with_their_rank_variables(slurm):
    """With no setting: TLS with a certificate made for the run, a generated admin token, the
    first node's name bound (not 0.0.0.0)."""
    run, out, data_dir = slurm
    result = run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "train.sbatch: samplerd serving at localhost:" in result.stdout
    assert "(TLS; state in" in result.stdout
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(3)]
    port = result.stdout.split("serving at localhost:")[1].split()[0]
    for rank, seen in enumerate(ranks):
        assert seen["health"] == "SERVING", seen
        assert seen["RANK"] == seen["LOCAL_RANK"] == str(rank)
        assert seen["WORLD_SIZE"] == "3"
        assert seen["MASTER_ADDR"] == "localhost" and int(seen["MASTER_PORT"]) > 0
        assert seen["SAMPLERD_ADDRESS"] == f"localhost:{port}"
        assert seen["SAMPLERD_CA"] == f"{data_dir}.auth/ca.pem" and seen["has_token"]
        assert (seen["with_token"], seen["without_token"]) == ("OK", "UNAUTHENTICATED"), seen
    auth_dir = pathlib.Path(f"{data_dir}.auth")
    assert stat.S_IMODE(auth_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((auth_dir / "tokens").stat().st_mode) == 0o600
    assert not (auth_dir / "ca.key").exists()  # Nothing more can be signed with it.
    # The server ran on the job's state directory and was stopped at the end.
    assert (data_dir / "jobs").is_dir()
    assert lock_is_free(data_dir), "samplerd still runs after the script ended"


def test_mutual_tls_with_own_certificates_the_health_check_presents_the_client_cert(slurm,
                                                                                     tmp_path):
    """With --tls_client_ca the health check must present a client certificate, or the job
    waits its whole start timeout and ends "not SERVING"."""
    run, out, _ = slurm
    certs = tmp_path / "certs"
    subprocess.run(["bash", str(ROOT / "tests" / "make_test_certs.sh"), str(certs)], check=True)
    result = run(SAMPLERD_TLS_CERT=str(certs / "server.pem"),
                 SAMPLERD_TLS_KEY=str(certs / "server.key"), SAMPLERD_CA=str(certs / "ca.pem"),
                 SAMPLERD_CLIENT_CA=str(certs / "ca.pem"),
                 SAMPLERD_CLIENT_CERT=str(certs / "client.pem"),
                 SAMPLERD_CLIENT_KEY=str(certs / "client.key"), SAMPLERD_START_TIMEOUT="20")
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(3):
        seen = json.loads((out / f"rank-{rank}.json").read_text())
        assert seen["health"] == "SERVING" and seen["with_token"] == "OK", seen
        assert seen["SAMPLERD_CLIENT_CERT"] == str(certs / "client.pem")
    # Mutual TLS without a client certificate to present: refused before anything starts.
    result = run(SAMPLERD_TLS_CERT=str(certs / "server.pem"),
                 SAMPLERD_TLS_KEY=str(certs / "server.key"), SAMPLERD_CA=str(certs / "ca.pem"),
                 SAMPLERD_CLIENT_CA=str(certs / "ca.pem"))
    assert result.returncode != 0 and "SAMPLERD_CLIENT_CERT" in result.stderr


def test_plaintext_only_when_asked_for(slurm):
    run, out, _ = slurm
    result = run(SAMPLERD_PLAINTEXT="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SAMPLERD_PLAINTEXT=1: no TLS, no token" in result.stderr
    assert "(plaintext; state in" in result.stdout
    seen = json.loads((out / "rank-0.json").read_text())
    assert seen["health"] == "SERVING" and seen["without_token"] == "OK", seen


def test_no_trainer_starts_when_the_server_does_not(slurm):
    run, out, _ = slurm
    result = run(SAMPLERD_FLAGS="--max_jobs=0")  # The server refuses this value at start.
    assert result.returncode == 1
    assert "samplerd exited before serving" in result.stderr
    assert "max_jobs" in result.stderr  # Its own message is passed on.
    assert not list(out.iterdir()), "a trainer started without a server"


def test_the_trainers_exit_status_is_the_jobs(slurm):
    run, out, data_dir = slurm
    (out.parent / "trainer.py").write_text("import sys; sys.exit(3)")
    result = run()
    assert result.returncode == 3, result.stdout + result.stderr
    assert lock_is_free(data_dir)


def test_every_shell_script_is_shellcheck_clean():
    scripts = sorted(p for d in ("deploy", "tools") for p in (ROOT / d).rglob("*")
                     if p.suffix in (".sh", ".sbatch"))
    assert SBATCH in scripts and ROOT / "tools" / "run_tests.sh" in scripts
    result = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_failure_to_make_the_run_certificate_is_said_not_silent(slurm, tmp_path):
    """openssl failing (missing, a bad configuration) stops the script with its message; no
    trainer starts."""
    run, out, _ = slurm
    broken = tmp_path / "bin" / "openssl"
    broken.write_text("#!/bin/sh\necho 'openssl: cannot load provider (stand-in)' >&2\nexit 1\n")
    broken.chmod(stat.S_IRWXU)
    result = run()
    assert result.returncode != 0
    assert "openssl" in result.stderr and "cannot load provider (stand-in)" in result.stderr, (
        result.stderr)
    assert not list(out.iterdir())
