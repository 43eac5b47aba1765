"""samplerctl run as a user runs it: a subprocess (`python -m samplerd.ctl`) against a real
samplerd on a free port; its exit codes, stdout (--json parsed) and stderr messages."""

import json
import os
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

import samplerd
from samplerd import ctl
from samplerd._proto import samplerd_pb2 as pb
from samplerd._proto import samplerd_pb2_grpc as pb_grpc
from conftest import ROOT, SamplerdProcess

CLIENT_DIR = ROOT / "client" / "python"


def ctl_env(**extra):
    """The environment of a samplerctl run: the worktree's package, none of the caller's
    SAMPLERD_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAMPLERD_")}
    env["PYTHONPATH"] = str(CLIENT_DIR)
    env.update(extra)
    return env


def ctl_cmd(target, *args):
    return [sys.executable, "-m", "samplerd.ctl", *(["--target", target] if target else []),
            *map(str, args)]


def run_ctl(target, *args, env=None, timeout=30):
    """Runs samplerctl [--target TARGET] ARGS to completion."""
    return subprocess.run(ctl_cmd(target, *args), capture_output=True, text=True,
                          env=env or ctl_env(), timeout=timeout)


def run_json(target, *args, expect_rc=0):
    """Runs samplerctl --json ARGS; checks the exit code; returns stdout's one JSON document."""
    result = run_ctl(target, "--json", *args)
    assert result.returncode == expect_rc, (result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout)


def write(path, text):
    path.write_text(text)
    return path


SPEC = """\
num_samples: 1000
world_size: 2
samples_per_epoch: 400
seed: 7
policy:
  loss: LOSS
  alpha: 1
  mix: 0.1
"""


def test_create_list_status_delete(server, tmp_path):
    target = server.address
    spec = write(tmp_path / "spec.yaml", SPEC)
    job = run_json(target, "create", "train", "--spec", spec)
    assert job["name"] == "train" and job["plan_ready"] is True
    assert job["spec"]["num_samples"] == "1000" and job["spec"]["world_size"] == 2
    assert job["spec"]["policy"]["loss"] == "LOSS" and job["spec"]["policy"]["mix"] == 0.1
    # The --json spec goes back into create as a JSON spec: the same spec, so idempotent.
    status = run_json(target, "status", "train")
    same = write(tmp_path / "same.json", json.dumps(status["job"]["spec"]))
    assert run_json(target, "create", "train", "--spec", same)["name"] == "train"

    assert status["job"]["current_epoch"] == "0"
    assert [r["rank"] for r in status["ranks"]] == [0, 1]
    assert status["weights"]["effective_sample_size"] == pytest.approx(1000)
    # Global options also after the command; the target also from SAMPLERD_TARGET.
    listed = subprocess.run(ctl_cmd(None, "list", "--json"), capture_output=True, text=True,
                            env=ctl_env(SAMPLERD_TARGET=target), timeout=30)
    assert listed.returncode == 0, listed.stderr
    assert [j["name"] for j in json.loads(listed.stdout)["jobs"]] == ["train"]

    human = run_ctl(target, "status", "train")
    assert human.returncode == 0
    assert "job train: epoch 0, plan ready" in human.stdout
    assert "UNIFORM x LOSS" in human.stdout and "ESS 1000" in human.stdout
    table = run_ctl(target, "list").stdout.splitlines()
    assert table[0].split()[:6] == ["NAME", "EPOCH", "PLAN", "N", "M", "WORLD"]
    assert table[1].split()[:6] == ["train", "0", "ready", "1000", "400", "2"]

    assert run_json(target, "delete", "train") == {"job": "train", "deleted": True}
    assert run_json(target, "list") == {"jobs": []}


def test_bad_specs_name_the_file_and_field_and_create_nothing(server, tmp_path):
    target = server.address
    cases = {  # file content -> what stderr must name
        "num_samples: 10\nworld_size: 1\npolicy: {alphaa: 1}\n": ['"alphaa"', "JobSpec.policy"],
        "num_samples: 10\nworld_size: 1\nreplacment: true\n": ['"replacment"'],
        "num_samples: 10\nworld_size: 1\norder: RANDOM\n": ["RANDOM", "JobSpec.order"],
        "num_samples: -5\nworld_size: 1\n": ["num_samples", "-5"],
        "num_samples: [10\n": ["not valid YAML"],
        "- 10\n- 1\n": ["expected a mapping of JobSpec fields", "list"],
    }
    for i, (text, names) in enumerate(cases.items()):
        path = write(tmp_path / f"bad{i}.yaml", text)
        result = run_ctl(target, "create", "j", "--spec", path)
        assert result.returncode == ctl.EXIT_BAD_INPUT, (text, result.stderr)
        assert result.stderr.startswith(f"samplerctl: {path}: "), result.stderr
        for name in names:
            assert name in result.stderr, (text, result.stderr)
    missing = run_ctl(target, "create", "j", "--spec", tmp_path / "nope.yaml")
    assert missing.returncode == ctl.EXIT_BAD_INPUT
    assert f"{tmp_path / 'nope.yaml'}: cannot read" in missing.stderr
    # A spec that parses but that the server refuses: INVALID_ARGUMENT naming the field.
    zero = write(tmp_path / "zero.json", '{"num_samples": 10, "world_size": 0}')
    result = run_ctl(target, "--json", "create", "j", "--spec", zero)
    assert result.returncode == ctl.EXIT_BAD_INPUT
    assert result.stderr.startswith("samplerctl: INVALID_ARGUMENT: ") and \
        "world_size" in result.stderr
    assert json.loads(result.stdout)["error"]["code"] == "INVALID_ARGUMENT"
    assert run_json(target, "list") == {"jobs": []}

    # The same name with another spec: ALREADY_EXISTS, and the job is unchanged.
    run_json(target, "create", "j", "--spec", write(tmp_path / "a.yaml", SPEC))
    other = write(tmp_path / "b.yaml", SPEC.replace("seed: 7", "seed: 8"))
    result = run_ctl(target, "create", "j", "--spec", other)
    assert result.returncode == ctl.EXIT_CONFLICT
    assert result.stderr.startswith("samplerctl: ALREADY_EXISTS: ")
    assert run_json(target, "status", "j")["job"]["spec"]["seed"] == "7"


def test_unknown_job_exit_codes(server, tmp_path):
    target = server.address
    weights = tmp_path / "w.npy"
    np.save(weights, np.ones(3, dtype=np.float32))
    for args in (("status", "ghost"), ("delete", "ghost"), ("upload-weights", "ghost", weights),
                 ("status", "ghost", "--watch")):
        result = run_ctl(target, *args)
        assert result.returncode == ctl.EXIT_NOT_FOUND, (args, result.stderr)
        assert result.stderr.startswith("samplerctl: NOT_FOUND: ") and "ghost" in result.stderr
    error = run_json(target, "status", "ghost", expect_rc=ctl.EXIT_NOT_FOUND)["error"]
    assert error["code"] == "NOT_FOUND" and error["exit_code"] == 3 and "ghost" in error["message"]
    assert run_json(target, "delete", "ghost", "--if-exists") == {"job": "ghost",
                                                                 "deleted": False}


def test_uploads_from_npy(server, tmp_path):
    target = server.address

    def npy(name, array):
        np.save(tmp_path / name, array)
        return tmp_path / name

    run_json(target, "create", "static", "--spec",
             write(tmp_path / "s.yaml", "num_samples: 5\nworld_size: 1\npolicy: {base: STATIC}\n"))
    assert run_json(target, "status", "static")["job"]["plan_ready"] is False
    refused = {  # file -> what stderr must name besides the file
        npy("w2d.npy", np.ones((5, 1))): ["shape (5, 1)", "dtype float64"],
        npy("wstr.npy", np.array(["a", "b"])): ["shape (2,)", "dtype <U1"],
        npy("wempty.npy", np.zeros(0)): ["shape (0,)"],
        npy("wnan.npy", np.array([1, np.nan, 1, 1, 1])): ["weights[1] = nan"],
        npy("w4.npy", np.ones(4)): ["4"],  # The server's count check.
        write(tmp_path / "text.npy", "not numpy\n"): ["not a .npy array"],
    }
    for path, names in refused.items():
        result = run_ctl(target, "upload-weights", "static", path)
        assert result.returncode == ctl.EXIT_BAD_INPUT, (path, result.stderr)
        assert str(path) in result.stderr, result.stderr
        for name in names:
            assert name in result.stderr, (path, result.stderr)
    assert run_json(target, "status", "static")["job"]["plan_ready"] is False  # Nothing applied.
    good = npy("w.npy", np.array([1, 2, 3, 4, 5], dtype=np.float32))
    assert run_json(target, "upload-weights", "static", good) == {
        "job": "static", "file": str(good), "received": 5}
    status = run_json(target, "status", "static")
    assert status["job"]["plan_ready"] is True
    assert status["weights"]["max"] == pytest.approx(5 / 3)  # The weights arrived (mean 1).
    # Labels: an integer dtype; a job whose policy is not CLASS_BALANCED refuses them.
    labels = npy("labels.npy", np.array([0, 1, 0, 1, 1], dtype=np.int32))
    result = run_ctl(target, "upload-labels", "static", labels)
    assert result.returncode == ctl.EXIT_CONFLICT
    assert result.stderr.startswith("samplerctl: FAILED_PRECONDITION: ")
    run_json(target, "create", "balanced", "--spec", write(
        tmp_path / "b.yaml", "num_samples: 5\nworld_size: 1\npolicy: {base: CLASS_BALANCED}\n"))
    result = run_ctl(target, "upload-labels", "balanced", good)  # float32: not labels.
    assert result.returncode == ctl.EXIT_BAD_INPUT
    assert f"{good}: shape (5,) dtype float32" in result.stderr
    assert run_json(target, "upload-labels", "balanced", labels)["received"] == 5
    status = run_json(target, "status", "balanced")
    assert status["weights"]["min"] == pytest.approx(5 / 6) and status["job"]["plan_ready"]


def test_status_says_when_the_epoch_shown_is_being_planned():
    # GetJobStatus while epoch 3 is planned (issue 33): the epoch being planned, no progress.
    status = pb.JobStatus(job=pb.Job(name="p", current_epoch=3, world_size=2), planning=True,
                          ranks=[pb.RankProgress(rank=0), pb.RankProgress(rank=1)])
    text = ctl._format_status(status)
    assert "0/2 ended epoch 3 (planning it: no rank has started it)" in text
    status.planning = False
    assert "planning it" not in ctl._format_status(status)


def test_status_of_a_mixture_job_being_planned_shows_no_window():
    # The window's fields are unset (0) while no plan is ready (issue 35 review 8): "-", not 0.
    group = pb.GroupStatus(group=4, weight=0.5)
    status = pb.JobStatus(job=pb.Job(name="m", current_epoch=3, world_size=1), planning=True,
                          mixture=pb.MixtureStatus(groups=9, top_groups=[group]))
    lines = ctl._format_status(status).splitlines()
    at = lines.index("  mixture  9 groups; the 1 heaviest:")
    assert lines[at + 2].split() == ["4", "0.5", "-", "-", "-"]
    status.job.plan_ready, status.planning = True, False
    group = status.mixture.top_groups[0]
    group.window_count, group.position = 7, 2
    assert ctl._format_status(status).splitlines()[at + 2].split() == ["4", "0.5", "7", "0", "2"]


def test_unreachable_server_and_bad_connection_files(tmp_path):
    stopped = SamplerdProcess()
    target = stopped.address
    assert stopped.stop() == 0
    result = run_ctl(target, "--json", "list")
    assert result.returncode == ctl.EXIT_UNAVAILABLE, result.stderr
    assert result.stderr.startswith("samplerctl: UNAVAILABLE: ") and target in result.stderr
    assert json.loads(result.stdout)["error"]["exit_code"] == ctl.EXIT_UNAVAILABLE
    # A certificate file that cannot be read is bad input, named, before any connection.
    result = run_ctl(target, "list", "--ca", tmp_path / "ca.pem")
    assert result.returncode == ctl.EXIT_BAD_INPUT
    assert result.stderr.startswith(f"samplerctl: {tmp_path / 'ca.pem'}: cannot read")
    result = run_ctl(target, "list", env=ctl_env(SAMPLERD_CLIENT_CERT=str(tmp_path / "c.pem")))
    assert result.returncode == ctl.EXIT_BAD_INPUT and "c.pem: cannot read" in result.stderr
    usage = run_ctl(target, "status")  # No JOB: argparse's usage error.
    assert usage.returncode == ctl.EXIT_BAD_INPUT and "usage: samplerctl" in usage.stderr


def test_health(server):
    result = run_ctl(server.address, "--json", "health")
    report = json.loads(result.stdout)
    services = report["services"]
    assert set(services) == {"", "samplerd.v1.Sampler"}
    assert services[""] == "SERVING"
    # Exit 0 exactly when every service is SERVING (the named one is SERVICE_UNKNOWN on a
    # server from before issue 13's health fix).
    serving = all(s == "SERVING" for s in services.values())
    assert report["serving"] is serving
    assert result.returncode == (ctl.EXIT_OK if serving else ctl.EXIT_NOT_SERVING)


def test_health_is_not_serving_while_the_server_shuts_down():
    """SIGTERM turns health NOT_SERVING while a call holds the server in its grace period."""
    server = SamplerdProcess("--grace_period_ms=30000")
    release = threading.Event()
    held = None
    try:
        # A loss report whose client has not finished writing: its handler waits for the next
        # batch, and the shutdown waits for this call (shard streams would be ended at once).
        def batches():
            release.wait(60)
            yield from ()
        channel = grpc.insecure_channel(server.address)
        held = pb_grpc.SamplerStub(channel).ReportLosses.future(batches(), timeout=60)
        time.sleep(0.2)  # The handler is running.
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while True:
            result = run_ctl(server.address, "--json", "health")
            report = json.loads(result.stdout)
            if report["services"][""] != "SERVING" or time.monotonic() > deadline:
                break
        assert report["services"][""] == "NOT_SERVING", report
        assert result.returncode == ctl.EXIT_NOT_SERVING and report["serving"] is False
    finally:
        release.set()
        if held is not None:
            held.cancel()
            channel.close()
        assert server.stop() == 0


class Reader:
    """Collects a process's stdout lines in a thread (so the test never blocks on a read)."""

    def __init__(self, proc):
        self.lines = queue.Queue()
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for line in stream:
            self.lines.put(line)

    def until(self, predicate, timeout=15):
        """Reads lines until predicate(line) holds; returns the lines read."""
        seen = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            seen.append(line)
            if predicate(line):
                return seen
        pytest.fail(f"no such line within {timeout} s; read: {seen[-5:]}")


def test_status_watch_follows_a_job_until_ctrl_c_or_deletion(server, client):
    client.create_job("w", num_samples=100, world_size=2, samples_per_epoch=40, loss="loss")
    watch = subprocess.Popen(ctl_cmd(server.address, "--json", "status", "w", "--watch",
                                     "--interval", "0.05"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=ctl_env())
    human = subprocess.Popen(ctl_cmd(server.address, "status", "w", "--watch", "--interval",
                                     "0.05"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=ctl_env())
    try:
        reader, human_reader = Reader(watch), Reader(human)
        reader.until(lambda line: json.loads(line)["job"]["current_epoch"] == "0")
        # Rank 0 streams and reports epoch 0: the watch shows its progress before the epoch ends.
        shard = client.read_shard("w", 0, 0, 2, observe=True)
        client.report_losses("w", 0, 0, shard, shard % 7 + 0.5, np.arange(shard.size))
        progress = reader.until(lambda line: json.loads(line)["ranks"][0]["losses_accepted"]
                                == str(shard.size))
        assert json.loads(progress[-1])["ranks"][0]["indices_streamed"] == str(shard.size)
        assert json.loads(progress[-1])["ranks"][1]["ended"] is False
        for rank in (0, 1):
            client.end_epoch("w", 0, rank)
        lines = reader.until(lambda line: json.loads(line)["job"]["current_epoch"] == "1")
        closed = json.loads(lines[-1])
        assert closed["samples_seen"] == str(np.unique(shard).size)
        assert closed["weights"]["max"] > closed["weights"]["min"]  # Recomputed from losses.
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=10) == ctl.EXIT_OK, watch.stderr.read()
        reader.thread.join(timeout=5)
        while not reader.lines.empty():  # Every refresh is one JSON document on one line.
            json.loads(reader.lines.get())

        # The human-readable watch ends with the job's deletion, with NOT_FOUND's exit code.
        seen = human_reader.until(lambda line: line.startswith("job w: epoch 1"))
        client.delete_job("w")
        assert human.wait(timeout=10) == ctl.EXIT_NOT_FOUND
        assert human.stderr.read().startswith("samplerctl: NOT_FOUND: ")
        human_reader.thread.join(timeout=5)
        text = "".join(seen + list(human_reader.lines.queue))
        assert "Every 0.05 s: samplerctl status w" in text and "RANK  STREAMED" in text
    finally:
        for proc in (watch, human):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_out_of_range_integers_are_bad_input_not_a_traceback(server, client):
    """A value beyond the proto field's width (world_size is uint32, epoch uint64) is exit 2
    naming the field and value, not protobuf's ValueError traceback (exit 1)."""
    client.create_job("wide", num_samples=8, world_size=1)
    for args, field in ((("resize", "wide", 0, 2**33), "world_size = 8589934592"),
                        (("resize", "wide", 2**64, 1), f"epoch = {2**64}"),
                        (("rewind", "wide", 2**64), f"epoch = {2**64}"),
                        (("resize", "wide", 0, -1), None)):  # argparse takes -1 for an option.
        result = run_ctl(server.address, *args)
        assert result.returncode == ctl.EXIT_BAD_INPUT, (args, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        if field:
            assert result.stderr.startswith(f"samplerctl: INVALID_ARGUMENT: {field}: must be "
                                            "an integer from 0 to"), result.stderr
    assert client.get_job("wide").spec.world_size == 1  # Nothing changed.


def test_the_help_says_which_exit_code_tls_failures_give():
    """A refused TLS handshake reaches the client as UNAVAILABLE (test_security.py checks exit
    5 with a real one): the help must say so, and keep 6 for the server's refusals."""
    help_text = run_ctl(None, "--help").stdout
    assert "5  cannot reach the server" in help_text and "TLS handshake failed" in help_text
    assert "6  the server refused the call" in help_text
    assert "certificate" not in ctl.EXIT_CODES[ctl.EXIT_DENIED]


def test_samplerctl_entry_point_is_installed(tmp_path):
    """pip installs a `samplerctl` script (pyproject's [project.scripts]) that runs the CLI."""
    source = tmp_path / "src"
    shutil.copytree(CLIENT_DIR, source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(source)],
                   check=True, capture_output=True, timeout=120)
    script = target / "bin" / "samplerctl"
    assert os.access(script, os.X_OK)
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30,
                            env=dict(ctl_env(), PYTHONPATH=str(target)))
    assert result.returncode == 0, result.stderr
    assert "exit codes:" in result.stdout
    for code in ctl.EXIT_CODES:  # The documented table is the one main() uses.
        assert f"\n  {code:>3}  {ctl.EXIT_CODES[code][:20]}" in result.stdout
    assert "3  no such job: NOT_FOUND" in result.stdout
    readme = (CLIENT_DIR / "README.md").read_text()
    for code in ctl.EXIT_CODES:  # The README's table has a row for each.
        assert f"\n| {code} | " in readme, code


def test_create_again_resume_and_rewind(tmp_path):
    """A job past epoch 0: `create` again exits 4 saying what to do; --resume and `rewind` are
    the ways on."""
    from conftest import SamplerdProcess
    import samplerd
    server = SamplerdProcess("--rewind_epochs=3")
    try:
        target = server.address
        spec = write(tmp_path / "spec.yaml", SPEC)
        assert run_json(target, "create", "train", "--spec", spec)["current_epoch"] == "0"
        with samplerd.Client(target, timeout=20) as c:
            for epoch in (0, 1):
                for rank in (0, 1):
                    c.end_epoch("train", epoch, rank)
                c.read_shard("train", epoch + 1, 0, 2, observe=True)  # Waits for the next epoch's plan.
        again = run_ctl(target, "create", "train", "--spec", spec)
        assert again.returncode == 4, again.stderr
        assert "at epoch 2: resume it" in again.stderr and "rewind it" in again.stderr
        resumed = run_json(target, "create", "train", "--spec", spec, "--resume")
        assert resumed["current_epoch"] == "2" and resumed["rewindable_epochs"] == ["0", "1", "2"]
        rewound = run_json(target, "rewind", "train", "1")
        assert rewound["current_epoch"] == "1" and rewound["rewindable_epochs"] == ["0", "1"]
        assert "rewindable epochs  0, 1" in run_ctl(target, "status", "train").stdout
        too_far = run_ctl(target, "rewind", "train", "5")
        assert too_far.returncode == 4 and "after the current epoch 1" in too_far.stderr
        resized = run_json(target, "resize", "train", "1", "3")
        assert resized["world_size"] == 3 and resized["deal"] == 1
        assert "dealt   to 3 ranks (deal 1 of epoch 1)" in run_ctl(target, "status", "train").stdout
        bad = run_ctl(target, "resize", "train", "1", "0")
        assert bad.returncode == 2 and "world_size = 0" in bad.stderr
    finally:
        assert server.stop() == 0


MIXTURE_SPEC = """\
world_size: 2
samples_per_epoch: 120
mixture:
  group_sizes: [300, 40, 1000]
  group_weights: [1, 2, 1]
"""


def test_status_of_a_mixture_job_lists_its_heaviest_groups(server, tmp_path):
    target = server.address
    spec = write(tmp_path / "mixture.yaml", MIXTURE_SPEC)
    job = run_json(target, "create", "mix", "--spec", spec)
    assert job["spec"]["num_samples"] == "1340"  # The sizes' sum, filled in.
    status = run_json(target, "status", "mix")
    groups = status["mixture"]["top_groups"]
    assert [g.get("group", "0") for g in groups] == ["1", "0", "2"]
    assert [g["window_count"] for g in groups] == ["60", "30", "30"]
    human = run_ctl(target, "status", "mix").stdout.splitlines()
    at = human.index("  mixture  3 groups; the 3 heaviest:")
    assert human[at + 1].split() == ["GROUP", "WEIGHT", "WINDOW", "PASS", "POSITION"]
    # Group 1 (40 samples) took 60: one pass and 20 into its second.
    assert human[at + 2].split() == ["1", "0.5", "60", "1", "20"]
    assert human[at + 3].split() == ["0", "0.25", "30", "0", "30"]


def test_weights_sets_static_group_weights_and_shows_their_history(server, tmp_path):
    target = server.address
    spec = write(tmp_path / "mixture.yaml", MIXTURE_SPEC)
    run_json(target, "create", "mixw", "--spec", spec)
    done = run_ctl(target, "weights", "mixw", "--set", "1", "1", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "job mixw: group weights set, in force from epoch 1"
    assert lines[1] == "job mixw: 3 groups, rule STATIC_WEIGHTS; weights in force at epoch 0:"
    # Epoch 0's weights: the spec's (the new ones apply from epoch 1).
    assert lines[lines.index("history (the last 1 of 1 epochs kept):") + 1].split() == [
        "EPOCH", "g1", "g0", "g2"]
    history = run_json(target, "weights", "mixw")["history"]
    assert [h.get("epoch", "0") for h in history] == ["0"]
    assert history[0]["weights"] == [0.5, 0.25, 0.25]
    bad = run_ctl(target, "weights", "mixw", "--set", "1", "-1", "1")
    assert bad.returncode == 2 and "group_weights[1] = -1" in bad.stderr
    plot = tmp_path / "w.png"
    drawn = run_ctl(target, "weights", "mixw", "--plot", str(plot))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert drawn.returncode == 2 and "needs matplotlib" in drawn.stderr
    else:
        assert drawn.returncode == 0, drawn.stderr
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
