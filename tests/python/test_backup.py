"""`samplerctl backup` of a live --data_dir, restored into a new server (docs/PERSISTENCE.md,
Backup and restore).

A real samplerd with --data_dir serves two jobs; while a loader thread keeps reporting losses
to one of them (acknowledged calls land during the backup), the backup is taken with the
samplerctl command line. A second samplerd is started on the copy: it recovers, the other job
is where it was at the backup, and when both servers then get the same calls, they make the
same plans bit for bit. The loader's job holds at least every batch acknowledged before the
backup began and at most those acknowledged by its end.
"""

import json
import os
import subprocess
import sys
import threading

import numpy as np

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
            shard0 = client.read_shard("train", 0, 0, 1)
            report(client, "train", 0, shard0, range(10))
            client.end_epoch("train", 0, 0)
            shard1 = client.read_shard("train", 1, 0, 1)
            report(client, "train", 1, shard1, range(5))

            busy = client.read_shard("busy", 0, 0, 1)
            acknowledged, stop = [], threading.Event()

            def loader():
                with samplerd.Client(live.address, timeout=20) as c:
                    k = 0
                    while not stop.is_set() and (k + 1) * BATCH <= len(busy):
                        report(c, "busy", 0, busy, [k])
                        acknowledged.append(k)
                        k += 1
            thread = threading.Thread(target=loader)
            thread.start()
            while len(acknowledged) < 20:
                stop.wait(0.01)
            before = len(acknowledged)
            result = samplerctl("--json", "backup", data_dir, copy)
            after = len(acknowledged)
            stop.set()
            thread.join()
            assert result.returncode == 0, result.stderr
            summary = json.loads(result.stdout)
            assert summary["server_pid"] == live.proc.pid and summary["jobs"] == 2, summary
            assert summary["linked_bytes"] > 0  # The snapshots: hard links, not copies.

            # The live server goes on: the rest of epoch 1, then epoch 2's plan.
            report(client, "train", 1, shard1, range(5, 10))
            client.end_epoch("train", 1, 0)
            live_plan2 = client.read_shard("train", 2, 0, 1)
            assert client.status("busy").ranks[0].losses_accepted >= BATCH * after

        restored = SamplerdProcess(f"--data_dir={copy}")
        with samplerd.Client(restored.address, timeout=20) as client:
            job = client.get_job("train")
            assert job.current_epoch == 1
            assert client.status("train").ranks[0].losses_accepted == 5 * BATCH  # Of epoch 1.
            np.testing.assert_array_equal(client.read_shard("train", 1, 0, 1), shard1)
            report(client, "train", 1, shard1, range(5, 10))
            client.end_epoch("train", 1, 0)
            np.testing.assert_array_equal(client.read_shard("train", 2, 0, 1), live_plan2)
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
