"""`samplerctl backup` of a live --data_dir, restored into a new server (docs/PERSISTENCE.md,
Backup and restore).

A real samplerd with --data_dir serves two jobs; while a loader thread keeps reporting losses
to one of them (acknowledged calls land during the backup), the backup is taken with the
samplerctl command line. A second samplerd is started on the copy: it recovers, the other job
is where it was at the backup, and when both servers then get the same calls, they make the
same plans bit for bit. The loader's job holds at least every batch acknowledged before the
backup began and at most those sent by its end (a call the server took before the freeze
may be answered after it).
"""

import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import samplerd
from conftest import ROOT, SamplerdProcess

BATCH = 20


def losses_for(indices, epoch):
    return ((np.asarray(indices, dtype=np.int64) * (epoch + 3)) % 7) / 7.0 + 0.1


def report(client, job, epoch, shard, batches):
    for k in batches:
        positions = np.arange(k * BATCH, min((k + 1) * BATCH, len(shard)))
        client.report_losses(job, epoch, 0, shard[positions], losses_for(shard[positions], epoch),
                             positions, seq=k)


def samplerctl(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAMPLERD_")}
    env["PYTHONPATH"] = str(ROOT / "client" / "python")
    return subprocess.run([sys.executable, "-m", "samplerd.ctl", *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=env)


def test_a_live_backup_restores_into_a_new_server_with_the_same_plans(tmp_path):
    data_dir, copy = tmp_path / "state", tmp_path / "backup"
    live = SamplerdProcess(f"--data_dir={data_dir}")
    restored = None
    try:
        with samplerd.Client(live.address, timeout=20) as client:
            client.create_job("train", num_samples=400, world_size=1, samples_per_epoch=200,
                              loss="loss", seed=11)
            client.create_job("busy", num_samples=100_000, world_size=1, loss="loss")
            # "train": epoch 0 whole, epoch 1 half reported when the backup is taken.
            shard0 = client.read_shard("train", 0, 0, 1, observe=True)
            report(client, "train", 0, shard0, range(10))
            client.end_epoch("train", 0, 0)
            shard1 = client.read_shard("train", 1, 0, 1, observe=True)
            report(client, "train", 1, shard1, range(5))

            busy = client.read_shard("busy", 0, 0, 1, observe=True)
            sent, acknowledged, stop = [], [], threading.Event()

            def loader():
                with samplerd.Client(live.address, timeout=20) as c:
                    k = 0
                    while not stop.is_set() and (k + 1) * BATCH <= len(busy):
                        sent.append(k)
                        report(c, "busy", 0, busy, [k])
                        acknowledged.append(k)
                        k += 1
            thread = threading.Thread(target=loader)
            thread.start()
            while len(acknowledged) < 20:
                stop.wait(0.01)
            before = len(acknowledged)
            result = samplerctl("--json", "backup", data_dir, copy)
            after = len(sent)
            stop.set()
            thread.join()
            assert result.returncode == 0, result.stderr
            summary = json.loads(result.stdout)
            assert summary["server_pid"] == live.proc.pid and summary["jobs"] == 2, summary
            assert summary["linked_bytes"] > 0  # The snapshots: hard links, not copies.

            # The live server goes on: the rest of epoch 1, then epoch 2's plan.
            report(client, "train", 1, shard1, range(5, 10))
            client.end_epoch("train", 1, 0)
            live_plan2 = client.read_shard("train", 2, 0, 1, observe=True)
            assert client.status("busy").ranks[0].losses_accepted >= BATCH * len(acknowledged)

        restored = SamplerdProcess(f"--data_dir={copy}")
        with samplerd.Client(restored.address, timeout=20) as client:
            job = client.get_job("train")
            assert job.current_epoch == 1
            assert client.status("train").ranks[0].losses_accepted == 5 * BATCH  # Of epoch 1.
            np.testing.assert_array_equal(client.read_shard("train", 1, 0, 1, observe=True), shard1)
            report(client, "train", 1, shard1, range(5, 10))
            client.end_epoch("train", 1, 0)
            np.testing.assert_array_equal(client.read_shard("train", 2, 0, 1, observe=True), live_plan2)
            busy_accepted = client.status("busy").ranks[0].losses_accepted
            assert BATCH * before <= busy_accepted <= BATCH * after, (before, busy_accepted,
                                                                      after)
            assert busy_accepted % BATCH == 0  # Whole batches: each one was acknowledged whole.
    finally:
        assert live.stop() == 0
        if restored is not None:
            assert restored.stop() == 0


def test_backup_refuses_what_is_no_data_dir_and_an_existing_destination(tmp_path):
    result = samplerctl("backup", tmp_path / "nothing", tmp_path / "copy")
    assert result.returncode == 2
    assert "not a samplerd --data_dir (no jobs/ directory)" in result.stderr
    (tmp_path / "state" / "jobs").mkdir(parents=True)
    (tmp_path / "copy").mkdir()
    result = samplerctl("backup", tmp_path / "state", tmp_path / "copy")
    assert result.returncode == 2 and "copy: exists; give a new directory" in result.stderr
    # A stopped server's directory is copied as it is.
    result = samplerctl("backup", tmp_path / "state", tmp_path / "copy2")
    assert result.returncode == 0 and "no samplerd was running" in result.stdout


def stopped_threads(pid):
    """How many threads of `pid` are stopped (state T or t in /proc)."""
    count = 0
    for stat in pathlib.Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                count += 1
        except (FileNotFoundError, ProcessLookupError):
            pass
    return count


def resumes(pid, timeout_s=10):
    """Whether every thread of `pid` runs again (none stopped) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while stopped_threads(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def live_server(tmp_path):
    """A samplerd on tmp_path/state with a job that has a log (so a backup copies a file while
    the server is stopped); SIGCONT at the end whatever the test did, so that it can stop."""
    data_dir = tmp_path / "state"
    live = SamplerdProcess(f"--data_dir={data_dir}")
    try:
        with samplerd.Client(live.address, timeout=20) as client:
            client.create_job("train", num_samples=400, world_size=1, loss="loss", seed=11)
            report(client, "train", 0, client.read_shard("train", 0, 0, 1, observe=True), range(3))
        yield live, data_dir
    finally:
        if live.proc.poll() is None:
            os.kill(live.proc.pid, signal.SIGCONT)
        assert live.stop() == 0


# A backup process that dies (by the signal argv[4]) while the server is stopped: at its first
# file copy, which happens only then.
DIES_WHILE_THE_SERVER_IS_STOPPED = r'''
import os, shutil, signal, sys
sys.path.insert(0, sys.argv[1])
from samplerd import backup
def die(*args, **kwargs):
    os.kill(os.getpid(), int(sys.argv[4]))
    signal.pause()
shutil.copy2 = die
backup.backup_data_dir(sys.argv[2], sys.argv[3])
'''


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP])
def test_the_server_resumes_when_the_backup_is_killed_while_it_is_stopped(live_server, tmp_path,
                                                                        signum):
    live, data_dir = live_server
    copy = tmp_path / "copy"
    result = subprocess.run([sys.executable, "-c", DIES_WHILE_THE_SERVER_IS_STOPPED,
                             ROOT / "client" / "python", data_dir, copy, str(int(signum))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0, result.stderr
    assert resumes(live.proc.pid), f"samplerd left stopped after the backup got {signum!r}"
    with samplerd.Client(live.address, timeout=20) as client:
        assert client.get_job("train").name == "train"
    assert not copy.exists()  # No partial copy under the name a restore would use.


def test_ctrl_c_while_the_server_is_stopping_resumes_it(live_server, tmp_path, monkeypatch):
    live, data_dir = live_server
    from samplerd import backup

    stopped = backup._all_threads_stopped

    def interrupted(pid):  # Ctrl-C once the server has stopped (so that resumes() can tell).
        while not stopped(pid):
            time.sleep(0.001)
        raise KeyboardInterrupt
    monkeypatch.setattr(backup, "_all_threads_stopped", interrupted)
    with pytest.raises(KeyboardInterrupt):
        backup.backup_data_dir(data_dir, tmp_path / "copy")
    assert resumes(live.proc.pid)
    assert not (tmp_path / "copy").exists()


def test_a_failed_copy_is_an_error_naming_the_path_and_leaves_nothing(live_server, tmp_path,
                                                                      monkeypatch):
    live, data_dir = live_server
    from samplerd import backup

    def disk_full(source, target):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
    monkeypatch.setattr(backup.shutil, "copy2", disk_full)
    with pytest.raises(backup.BackupError, match="No space left on device"):
        backup.backup_data_dir(data_dir, tmp_path / "copy")
    assert resumes(live.proc.pid)
    assert not (tmp_path / "copy").exists()
    assert list(tmp_path.iterdir()) == [data_dir]  # No staging directory left either.
    # From the command line: exit 2 and a message, not a traceback.
    result = samplerctl("backup", data_dir, "/proc/no/such/place")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "/proc/no/such/place" in result.stderr, result.stderr


def test_a_lock_held_by_a_process_it_cannot_find_is_an_error_not_an_unstopped_copy(
        live_server, tmp_path, monkeypatch):
    """If /proc/locks does not show who holds DATA_DIR/LOCK (another view of the file system),
    the backup must not copy a running server's files without stopping it."""
    live, data_dir = live_server
    from samplerd import backup
    monkeypatch.setattr(backup, "lock_holder", lambda data_dir: None)
    with pytest.raises(backup.BackupError, match="locked by a process not found in /proc/locks"):
        backup.backup_data_dir(data_dir, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_no_samplerd_starts_on_a_directory_while_it_is_copied(tmp_path, monkeypatch):
    """Without a running server the backup holds DATA_DIR/LOCK: a samplerd starting meanwhile
    (its recovery would change the files being copied) is refused."""
    data_dir = tmp_path / "state"
    server = SamplerdProcess(f"--data_dir={data_dir}")
    with samplerd.Client(server.address, timeout=20) as client:
        client.create_job("train", num_samples=400, world_size=1, loss="loss", seed=11)
    assert server.stop() == 0
    from samplerd import backup
    from conftest import run_samplerd_expecting_failure
    copy2, starts = shutil.copy2, []

    def copy_while_a_server_starts(source, target):
        if not starts:
            starts.append(run_samplerd_expecting_failure(f"--data_dir={data_dir}"))
        return copy2(source, target)
    monkeypatch.setattr(backup.shutil, "copy2", copy_while_a_server_starts)
    summary = backup.backup_data_dir(data_dir, tmp_path / "copy")
    assert summary.server_pid is None and summary.jobs == 1
    rc, stderr = starts[0]
    assert rc == 1 and "is in use by another samplerd" in stderr, stderr
