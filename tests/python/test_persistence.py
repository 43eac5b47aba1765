"""--data_dir end to end: what a client was told survives a SIGKILL, training goes on with the plans
an uninterrupted server would have made, and damaged files stop the start (docs/PERSISTENCE.md).

Each test drives a persisted server (killed and restarted on the same directory) and, where plans
are compared, a reference server without --data_dir that gets the same calls and is never killed.
"""

import contextlib
import struct
import time

import numpy as np
import pytest

import samplerd
from conftest import SamplerdProcess, run_samplerd_expecting_failure

BATCH = 50  # Loss pairs per ReportLosses call; batch k of a shard is shard[k*BATCH:(k+1)*BATCH].


@pytest.fixture
def cluster():
    """start(*args) -> (process, client); every process still running at the end is killed."""
    with contextlib.ExitStack() as stack:
        processes = []

        def start(*args, **kwargs):
            process = SamplerdProcess(*args, **kwargs)
            processes.append(process)
            client = stack.enter_context(samplerd.Client(process.address, timeout=10))
            return process, client
        yield start
        for process in processes:
            process.kill()


def losses_for(indices, epoch):
    """The loss a trainer 'observes': a deterministic function of (index, epoch)."""
    indices = np.asarray(indices, dtype=np.int64)
    return ((indices * (epoch + 3)) % 7) / 7.0


def report(client, job, epoch, rank, shard, seqs):
    """Reports batches `seqs` of `shard` (the rank's shard as streamed), one call each (so each
    is acknowledged on its own); returns the summaries."""
    summaries = []
    for seq in seqs:
        positions = np.arange(seq * BATCH, min((seq + 1) * BATCH, len(shard)))
        part = shard[positions]
        summaries.append(client.report_losses(job, epoch, rank, part, losses_for(part, epoch),
                                              positions, seq=seq))
    return summaries


def loss_records(path):
    """The loss records of a write-ahead log (a shard read adds a stream-progress record)."""
    return [r for r in wal_records(path) if is_loss_record(r[1])]


def progress(client, job):
    """What a restart must keep: epoch, per-rank (accepted, ended), samples seen, weight stats.
    (indices_streamed is left out: it is logged but not synced, so it may lag after a crash.)"""
    s = client.status(job)
    w = s.weights
    return {"epoch": s.job.current_epoch,
            "ranks": [(r.rank, r.losses_accepted, r.ended) for r in s.ranks],
            "samples_seen": s.samples_seen,
            "weights": (w.min, w.max, w.mean, w.effective_sample_size, w.zero_count)}


def same_progress(expected):
    """`expected`, with the weight statistics compared to within float rounding."""
    return {**expected, "weights": pytest.approx(expected["weights"], rel=1e-9)}


def wait_plan_ready(client, job, epoch, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        j = client.get_job(job)
        if j.current_epoch == epoch and j.plan_ready:
            return
        assert time.monotonic() < deadline, f"epoch {epoch} of {job} not ready: {j}"
        time.sleep(0.02)


WAL_HEAD_BYTES = 8192  # server/persistence/record_log.h: two 4096-byte head blocks.


def wal_records(path):
    """(offset, payload) of each record of a write-ahead log, framed as in
    server/persistence/record_log.h (format 3): a head of WAL_HEAD_BYTES, then records
    u32 length | u32 crc(length) | payload | u32 crc(payload). The file must consist of whole
    records."""
    data = path.read_bytes()
    assert data[:8] == b"SMPLRDWL", f"{path}: not a samplerd log"
    records, pos = [], WAL_HEAD_BYTES
    while pos < len(data):
        assert pos + 8 <= len(data), f"{path}: cut header at {pos}"
        (length,) = struct.unpack_from("<I", data, pos)
        assert pos + 12 + length <= len(data), f"{path}: record at {pos} of length {length} cut"
        records.append((pos, data[pos + 8:pos + 8 + length]))
        pos += 12 + length
    return records


def is_loss_record(payload):
    return payload[:1] == b"\x0a"  # state.WalRecord field 1 (losses), length-delimited.


def flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# ---- What was acknowledged survives, and training goes on identically ----------------------------

def test_acknowledged_state_survives_sigkill_and_training_continues_identically(cluster,
                                                                                tmp_path):
    job, R = "train", 2
    spec = dict(num_samples=1000, world_size=R, samples_per_epoch=400, seed=11, loss="loss",
                alpha=2.0)  # M < N: the weights decide which samples are drawn.
    a_proc, a = cluster(f"--data_dir={tmp_path}")
    _, b = cluster()  # The reference: no --data_dir, never killed.
    for c in (a, b):
        c.create_job(job, **spec)
    job_dir = tmp_path / "jobs" / job
    assert (job_dir / "snapshot-0.bin").is_file(), sorted(tmp_path.rglob("*"))

    # Epoch 0: both ranks read, report everything, end.
    shards0 = [a.read_shard(job, 0, r, R, observe=True) for r in range(R)]
    for r in range(R):
        np.testing.assert_array_equal(shards0[r], b.read_shard(job, 0, r, R, observe=True))
        assert len(shards0[r]) == 200
        for c in (a, b):
            assert [s.accepted for s in report(c, job, 0, r, shards0[r], range(4))] == [50] * 4
            c.end_epoch(job, 0, r)
    # Epoch 1: rank 0 reports everything and ends; rank 1 reports half its shard.
    wait_plan_ready(a, job, 1)
    shards1 = [a.read_shard(job, 1, r, R, observe=True) for r in range(R)]
    for r in range(R):
        np.testing.assert_array_equal(shards1[r], b.read_shard(job, 1, r, R, observe=True))
    for c in (a, b):
        assert [s.accepted for s in report(c, job, 1, 0, shards1[0], range(4))] == [50] * 4
        assert not c.end_epoch(job, 1, 0).epoch_closed
        assert [s.accepted for s in report(c, job, 1, 1, shards1[1], range(2))] == [50] * 2
    before = progress(a, job)
    assert before == same_progress(progress(b, job))
    assert before["ranks"] == [(0, 200, True), (1, 100, False)]
    assert (job_dir / "snapshot-1.bin").is_file() and (job_dir / "wal-1.log").is_file(), \
        sorted(p.name for p in job_dir.iterdir())

    assert a_proc.kill() == -9
    _, a = cluster(f"--data_dir={tmp_path}")

    j = a.get_job(job)
    assert (j.current_epoch, j.plan_ready) == (1, True)
    assert progress(a, job) == same_progress(before)
    for r in range(R):  # The current epoch's shards are the ones handed out before the crash.
        np.testing.assert_array_equal(a.read_shard(job, 1, r, R, observe=True), shards1[r])
    # A resent, already acknowledged batch is a duplicate (the applied seqs were restored).
    for c in (a, b):
        again = report(c, job, 1, 1, shards1[1], [1])[0]
        assert (again.accepted, again.duplicates) == (0, 50)
    assert progress(a, job) == same_progress(progress(b, job))

    # Finish epoch 1 on both: epoch 2 must be planned from the same weights.
    for c in (a, b):
        assert [s.accepted for s in report(c, job, 1, 1, shards1[1], [2, 3])] == [50] * 2
        assert c.end_epoch(job, 1, 1).epoch_closed
    wait_plan_ready(a, job, 2)
    for r in range(R):
        shard2 = a.read_shard(job, 2, r, R, observe=True)
        np.testing.assert_array_equal(shard2, b.read_shard(job, 2, r, R, observe=True))
        assert not np.array_equal(shard2, shards1[r])  # The comparison is not trivially true.
    assert progress(a, job) == same_progress(progress(b, job))


def test_a_client_rides_through_a_samplerd_crash_and_restart(cluster, tmp_path):
    """A rank streaming and reporting while samplerd is killed and restarted on the same port:
    its stream resumes at the next position (nothing skipped or repeated), every loss reported
    before and after the crash counts, and the next epoch equals a reference server's."""
    import threading
    job = "ride"
    # 12 MB of indices: more than gRPC buffers ahead of the reader, so the stream really has
    # to be reopened on the restarted server. M < N: the weights decide the next epoch.
    spec = dict(num_samples=4_000_000, world_size=1, samples_per_epoch=3_000_000, seed=3,
                loss="loss")
    proc, _ = cluster(f"--data_dir={tmp_path}")
    port = proc.address.rsplit(":", 1)[1]
    _, ref = cluster()
    ref.create_job(job, **spec)
    expected = ref.read_shard(job, 0, 0, 1, observe=True)
    restarted = []
    with samplerd.Client(proc.address, timeout=10, max_retries=40, initial_backoff=0.05,
                         max_backoff=0.25) as c:
        c.create_job(job, **spec)
        got, seq = [], 0
        for chunk in c.stream_shard(job, 0, 0, 1, chunk_size=20_000, observe=True):
            got.extend(chunk.indices.tolist())
            positions = chunk.offset + np.arange(len(chunk.indices))
            summary = c.report_losses(job, 0, 0, chunk.indices, losses_for(chunk.indices, 0),
                                      positions, seq=seq)
            assert summary.accepted + summary.duplicates == len(chunk.indices)
            seq += 1
            if len(got) == 20_000:  # Mid-epoch: kill it, and bring it back on the same port.
                assert proc.kill() == -9
                timer = threading.Timer(0.5, lambda: restarted.append(
                    cluster(f"--data_dir={tmp_path}", f"--port={port}")))
                timer.start()
        timer.join()
        assert restarted, "the stream finished without the server coming back"
        np.testing.assert_array_equal(got, expected)
        status = c.status(job)
        assert status.ranks[0].losses_accepted == len(expected)
        assert status.ranks[0].indices_streamed == len(expected)
        assert c.end_epoch(job, 0, 0).epoch_closed
        wait_plan_ready(c, job, 1)
        after = c.read_shard(job, 1, 0, 1, observe=True)
    for seq, start in enumerate(range(0, len(expected), 1 << 20)):
        part = expected[start:start + (1 << 20)]
        ref.report_losses(job, 0, 0, part, losses_for(part, 0),
                          np.arange(start, start + len(part)), seq=seq)
    assert ref.end_epoch(job, 0, 0).epoch_closed
    wait_plan_ready(ref, job, 1)
    np.testing.assert_array_equal(after, ref.read_shard(job, 1, 0, 1, observe=True))


def test_uploaded_static_weights_survive_a_restart_before_the_first_epoch_ended(cluster,
                                                                               tmp_path):
    job, R, N = "static", 2, 500
    w = 1.0 + (np.arange(N) % 13)
    w[np.arange(N) % 5 == 0] = 0.0  # 100 samples that must never be drawn.
    spec = dict(num_samples=N, world_size=R, samples_per_epoch=200, seed=5, base="static")
    a_proc, a = cluster(f"--data_dir={tmp_path}")
    _, b = cluster()
    for c in (a, b):
        c.create_job(job, **spec)
        assert c.upload_weights(job, w) == N

    assert a_proc.kill() == -9  # Before anything was streamed or any epoch ended.
    _, a = cluster(f"--data_dir={tmp_path}")

    j = a.get_job(job)
    assert (j.current_epoch, j.plan_ready) == (0, True)
    assert a.status(job).weights.zero_count == 100
    for epoch in (0, 1):
        for r in range(R):
            shard = a.read_shard(job, epoch, r, R, timeout=5, observe=True)
            np.testing.assert_array_equal(shard, b.read_shard(job, epoch, r, R, observe=True))
            assert len(shard) == 100 and not np.any(shard % 5 == 0)
        for c in (a, b):
            for r in range(R):
                c.end_epoch(job, epoch, r)
        wait_plan_ready(a, job, epoch + 1)


def test_a_data_dir_of_the_previous_format_is_refused_naming_the_file_and_what_to_do(tmp_path):
    """tests/python/data/data_dir_log_format_2 was written by the release before log format 3
    (its README says how). docs/PERSISTENCE.md's rule: a server reads only its own format
    versions; another is refused at start, the files left as they are."""
    import hashlib
    import shutil
    from conftest import ROOT
    data_dir = tmp_path / "state"
    shutil.copytree(ROOT / "tests" / "python" / "data" / "data_dir_log_format_2", data_dir,
                    ignore=shutil.ignore_patterns("README.md"))
    job = data_dir / "jobs" / "run-v2"

    def digests():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in job.iterdir()}
    before = digests()
    rc, stderr = run_samplerd_expecting_failure(f"--data_dir={data_dir}")
    assert rc == 1
    assert (f"FAILED_PRECONDITION: recovering job 'run-v2' from {job}: {job}/wal-1.log: log "
            "format version 2; this samplerd reads version 3 (written by another samplerd "
            "release: run that release until the job ends, or move the job's directory away; "
            "docs/PERSISTENCE.md, Upgrade and rollback)") in stderr, stderr
    assert digests() == before  # Nothing rewritten.


def test_deleted_job_stays_deleted_after_restart(cluster, tmp_path):
    a_proc, a = cluster(f"--data_dir={tmp_path}")
    for name in ("keep", "gone"):
        a.create_job(name, num_samples=100, world_size=1, loss="loss")
        report(a, name, 0, 0, a.read_shard(name, 0, 0, 1, observe=True), [0])
    assert (tmp_path / "jobs" / "gone").is_dir()
    a.delete_job("gone")
    assert not (tmp_path / "jobs" / "gone").exists()

    assert a_proc.kill() == -9
    _, a = cluster(f"--data_dir={tmp_path}")

    assert [j.name for j in a.list_jobs()] == ["keep"]
    with pytest.raises(samplerd.NotFound):
        a.get_job("gone")
    assert not (tmp_path / "jobs" / "gone").exists()
    assert a.status("keep").ranks[0].losses_accepted == BATCH
    # The name is free again, for a fresh job with nothing of the old one.
    a.create_job("gone", num_samples=100, world_size=1, loss="loss")
    assert a.status("gone").ranks[0].losses_accepted == 0
    again = report(a, "gone", 0, 0, a.read_shard("gone", 0, 0, 1, observe=True), [0])[0]
    assert (again.accepted, again.duplicates) == (BATCH, 0)


def test_without_data_dir_nothing_is_written_or_restored(cluster, tmp_path):
    a_proc, a = cluster(cwd=tmp_path)
    a.create_job("mem", num_samples=100, world_size=1, loss="loss")
    report(a, "mem", 0, 0, a.read_shard("mem", 0, 0, 1, observe=True), [0])
    assert a_proc.kill() == -9
    assert list(tmp_path.iterdir()) == []
    _, a = cluster(cwd=tmp_path)
    assert a.list_jobs() == []


# ---- Damaged files ----------------------------------------------------------------------------

def _job_in_epoch_1(cluster, data_dir, job="j"):
    """Starts a server on `data_dir` with a one-rank job in epoch 1, losses applied in epoch 0 (so
    its snapshot holds weights and loss statistics); returns (process, client)."""
    proc, c = cluster(f"--data_dir={data_dir}")
    c.create_job(job, num_samples=1000, world_size=1, samples_per_epoch=400, loss="loss")
    shard = c.read_shard(job, 0, 0, 1, observe=True)
    report(c, job, 0, 0, shard, range(8))
    assert c.end_epoch(job, 0, 0).epoch_closed
    wait_plan_ready(c, job, 1)
    return proc, c


def test_corrupt_snapshot_refuses_to_start(cluster, tmp_path):
    proc, _ = _job_in_epoch_1(cluster, tmp_path)
    assert proc.kill() == -9
    job_dir = tmp_path / "jobs" / "j"
    # Control: the intact directory starts, with the job in epoch 1.
    proc, c = cluster(f"--data_dir={tmp_path}")
    assert c.get_job("j").current_epoch == 1
    assert proc.stop() == 0

    snapshots = sorted(job_dir.glob("snapshot-*.bin"), key=lambda p: int(p.stem.split("-")[1]))
    assert snapshots and snapshots[-1].name == "snapshot-1.bin", sorted(job_dir.iterdir())
    snapshot = snapshots[-1]
    size = snapshot.stat().st_size
    assert size > 1000 * 4, size  # Holds per-sample arrays: the middle byte is data.
    flip_byte(snapshot, size // 2)
    damaged = snapshot.read_bytes()

    rc, stderr = run_samplerd_expecting_failure(f"--data_dir={tmp_path}", timeout=10)
    assert rc != 0
    assert "jobs/j/snapshot-1.bin" in stderr, stderr
    assert snapshot.read_bytes() == damaged  # Left for the operator, not removed or rewritten.


def test_corrupt_wal_record_in_the_middle_refuses_to_start(cluster, tmp_path):
    proc, c = cluster(f"--data_dir={tmp_path}")
    c.create_job("j", num_samples=1000, world_size=1, loss="loss")
    indices = c.read_shard("j", 0, 0, 1, observe=True)  # One chunk: one stream-progress record.
    report(c, "j", 0, 0, indices, range(6))
    assert proc.kill() == -9
    wal = tmp_path / "jobs" / "j" / "wal-0.log"
    records = loss_records(wal)
    assert len(records) == 6 and len(wal_records(wal)) == 7
    # Control: the intact log starts, with every batch.
    proc, c = cluster(f"--data_dir={tmp_path}")
    assert c.status("j").ranks[0].losses_accepted == 6 * BATCH
    assert proc.stop() == 0

    offset, payload = loss_records(wal)[2]  # Followed by 3 intact records.
    flip_byte(wal, offset + 8 + len(payload) // 2)

    rc, stderr = run_samplerd_expecting_failure(f"--data_dir={tmp_path}", timeout=10)
    assert rc != 0
    assert "jobs/j/wal-0.log" in stderr, stderr


def test_torn_wal_tail_is_not_an_error(cluster, tmp_path):
    job = "j"
    proc, c = cluster(f"--data_dir={tmp_path}")
    c.create_job(job, num_samples=1000, world_size=1, samples_per_epoch=400, loss="loss")
    report(c, job, 0, 0, c.read_shard(job, 0, 0, 1, observe=True), range(2))
    assert c.end_epoch(job, 0, 0).epoch_closed
    wait_plan_ready(c, job, 1)
    indices = c.read_shard(job, 1, 0, 1, observe=True)  # One chunk: the log's first record, then 4 batches.
    report(c, job, 1, 0, indices, range(4))
    assert proc.kill() == -9

    wal = tmp_path / "jobs" / job / "wal-1.log"
    records = loss_records(wal)
    assert len(records) == 4 and len(wal_records(wal)) == 5 and wal_records(wal)[-1] == records[-1]
    # A crash in the middle of a fifth call's append, before its sync: its record (batch seq 4)
    # is cut short. Its acknowledgment would have followed the sync, so as far as the client
    # knows it was not sent.
    offset, payload = records[3]
    fifth = wal.read_bytes()[offset:offset + 12 + len(payload)]  # The same size as seq 4's.
    with open(wal, "ab") as f:
        f.write(fifth[:len(fifth) // 2])

    proc, c = cluster(f"--data_dir={tmp_path}")
    assert c.get_job(job).current_epoch == 1
    assert c.status(job).ranks[0].losses_accepted == 4 * BATCH
    # The client resends what it was never told was applied: seq 4 is new, seq 3 a duplicate.
    assert report(c, job, 1, 0, indices, [4])[0].accepted == BATCH
    assert report(c, job, 1, 0, indices, [3])[0].duplicates == BATCH
    # The torn bytes were cut before appending: the next start finds an intact log.
    assert proc.kill() == -9
    assert len(loss_records(wal)) == 5
    proc, c = cluster(f"--data_dir={tmp_path}")
    status = c.status(job)
    assert (status.job.current_epoch, status.ranks[0].losses_accepted) == (1, 5 * BATCH)


def _two_rank_job_with_acknowledged_epoch_1(cluster, data_dir, job="j"):
    """A two-rank job in epoch 1 (its snapshot committed, epoch 0's files gone) where rank 0 had
    ReportLosses and then EndEpoch acknowledged, then SIGKILL. Returns wal-1.log's path after a
    control start that shows the state came back intact."""
    proc, c = cluster(f"--data_dir={data_dir}")
    c.create_job(job, num_samples=1000, world_size=2, samples_per_epoch=400, loss="loss")
    assert not c.end_epoch(job, 0, 0).epoch_closed
    assert c.end_epoch(job, 0, 1).epoch_closed
    wait_plan_ready(c, job, 1)
    job_dir = data_dir / "jobs" / job
    deadline = time.monotonic() + 10
    while (job_dir / "wal-0.log").exists():  # The snapshot of epoch 1 is committed.
        assert time.monotonic() < deadline, sorted(job_dir.iterdir())
        time.sleep(0.02)
    # One chunk read: the log holds its progress record, the loss batch and the EndEpoch.
    assert report(c, job, 1, 0, c.read_shard(job, 1, 0, 2, observe=True), [0])[0].accepted == BATCH
    assert not c.end_epoch(job, 1, 0).epoch_closed
    acknowledged = progress(c, job)
    assert acknowledged["ranks"][0][1:] == (BATCH, True), acknowledged
    assert proc.kill() == -9
    wal = job_dir / "wal-1.log"
    # (snapshot-0.bin stays too: an epoch start kept for a rewind, --rewind_epochs.)
    assert sorted(p.name for p in job_dir.iterdir()) == ["snapshot-0.bin", "snapshot-1.bin",
                                                         "wal-1.log"]
    # Control: the intact directory starts with what was acknowledged.
    proc, c = cluster(f"--data_dir={data_dir}")
    assert progress(c, job) == same_progress(acknowledged)
    assert proc.stop() == 0
    return wal


def test_deleted_wal_refuses_to_start(cluster, tmp_path):
    wal = _two_rank_job_with_acknowledged_epoch_1(cluster, tmp_path)
    wal.unlink()
    rc, stderr = run_samplerd_expecting_failure(f"--data_dir={tmp_path}", timeout=10)
    assert rc != 0
    assert "DATA_LOSS" in stderr, stderr
    assert "jobs/j/wal-1.log is missing" in stderr, stderr
    assert not wal.exists()  # Nothing is created in its place.


def test_wal_cut_inside_an_acknowledged_record_refuses_to_start(cluster, tmp_path):
    wal = _two_rank_job_with_acknowledged_epoch_1(cluster, tmp_path)
    records = wal_records(wal)
    assert len(records) == 3 and is_loss_record(records[1][1]), records
    offset, payload = records[1]  # The acknowledged loss batch; the EndEpoch follows it.
    cut = offset + 8 + len(payload) // 2
    with open(wal, "r+b") as f:
        f.truncate(cut)
    rc, stderr = run_samplerd_expecting_failure(f"--data_dir={tmp_path}", timeout=10)
    assert rc != 0
    assert "DATA_LOSS" in stderr, stderr
    assert "jobs/j/wal-1.log: cut short" in stderr, stderr
    assert wal.stat().st_size == cut  # Left for the operator, not truncated further.


def test_stray_entries_in_the_jobs_directory_do_not_stop_the_start(cluster, tmp_path):
    proc, c = cluster(f"--data_dir={tmp_path}")
    c.create_job("j", num_samples=1000, world_size=1, loss="loss")
    report(c, "j", 0, 0, c.read_shard("j", 0, 0, 1, observe=True), range(2))
    assert proc.kill() == -9
    jobs = tmp_path / "jobs"
    (jobs / "lost+found").mkdir()  # Every fresh ext4 volume has one.
    (jobs / "lost+found" / "#4711").write_bytes(b"what fsck found")
    (jobs / "README").write_text("a stray file")
    proc, c = cluster(f"--data_dir={tmp_path}")
    assert [j.name for j in c.list_jobs()] == ["j"]
    assert c.status("j").ranks[0].losses_accepted == 2 * BATCH
    assert (jobs / "lost+found" / "#4711").read_bytes() == b"what fsck found"
    assert (jobs / "README").read_text() == "a stray file"
