"""samplerd's event log (docs/OPERATIONS.md): one key=value line per event, from the real binary.

Events: job created/deleted, epoch opened/closed, snapshot written, recovery at start-up, every
RPC ending INTERNAL / DATA_LOSS / RESOURCE_EXHAUSTED, shutdown. `--v=1` adds a line per RPC.
"""

import re
import shlex
import tempfile

import pytest

from conftest import SamplerdProcess


def run_and_log(args, drive):
    """Starts samplerd with ARGS at log level INFO, runs drive(client), stops it (SIGTERM).

    Returns the events of its stderr: a list of dicts of the key=value fields of each line that
    has an `event` field.
    """
    import samplerd
    with tempfile.TemporaryFile("w+") as err:
        # The fixture's --log_level=1 is overridden: the last value of a flag counts.
        server = SamplerdProcess(*args, "--log_level=0", stderr=err)
        try:
            with samplerd.Client(server.address, timeout=20) as client:
                drive(client)
        finally:
            assert server.stop() == 0
        err.seek(0)
        text = err.read()
    events = []
    for line in text.splitlines():
        message = line.split("] ", 1)[-1]  # After glog's prefix.
        if not message.startswith("event="):
            continue
        # Values are bare or double-quoted with C escapes (shlex splits both the same way).
        fields = dict(f.split("=", 1) for f in shlex.split(message, posix=True))
        events.append(fields)
    return events, text


def find(events, event, **fields):
    return [e for e in events if e["event"] == event
            and all(e.get(k) == str(v) for k, v in fields.items())]


def test_job_and_epoch_events_errors_and_shutdown():
    import samplerd

    def drive(client):
        client.create_job("logged", num_samples=32, world_size=1, loss="loss")
        with pytest.raises(samplerd.ResourceExhausted):
            client.create_job("second", num_samples=32, world_size=1)  # --max_jobs=1
        shard = client.read_shard("logged", 0, 0, 1, observe=True)
        client.report_losses("logged", 0, 0, shard[:4], [1.0] * 4, [0, 1, 2, 3], seq=1)
        client.end_epoch("logged", 0, 0)
        client.read_shard("logged", 1, 0, 1, observe=True)  # Waits for epoch 1.
        client.delete_job("logged")

    events, text = run_and_log(["--max_jobs=1"], drive)
    created = find(events, "job_created", job="logged", num_samples=32, world_size=1,
                   loss="LOSS")
    assert len(created) == 1, text
    assert int(created[0]["memory_bytes"]) > 0 and "ms" in created[0]
    assert find(events, "epoch_opened", job="logged", epoch=0), text
    assert find(events, "epoch_closed", job="logged", epoch=0), text
    opened = find(events, "epoch_opened", job="logged", epoch=1)
    assert opened and float(opened[0]["recompute_ms"]) >= 0 and float(opened[0]["plan_ms"]) >= 0
    assert find(events, "job_deleted", job="logged"), text
    # The refused CreateJob: method, code and the server's message, quoted whole.
    errors = find(events, "rpc_error", method="/samplerd.v1.Sampler/CreateJob",
                  code="RESOURCE_EXHAUSTED")
    assert len(errors) == 1, text
    assert "max jobs reached: 1 (--max_jobs)" in errors[0]["message"]
    # One audit line per management call, whatever its outcome, with who made it.
    audit = [(e["method"].rsplit("/", 1)[1], e["job"], e["code"]) for e in events
             if e["event"] == "audit"]
    assert audit == [("CreateJob", "logged", "OK"), ("CreateJob", "second", "RESOURCE_EXHAUSTED"),
                     ("DeleteJob", "logged", "OK")], text
    assert all(e["peer"].startswith("ipv4:127.0.0.1:") for e in find(events, "audit")), text
    # Shutdown, in order.
    names = [e["event"] for e in events]
    assert names.index("signal") < names.index("shutdown_started") < names.index("shutdown_done")
    assert find(events, "shutdown_done", drained="true")
    # Without --v, no per-RPC lines.
    assert not find(events, "rpc"), text


def test_verbose_flag_logs_every_rpc():
    events, text = run_and_log(["--v=1"], lambda client: client.list_jobs())
    assert find(events, "rpc", method="/samplerd.v1.Sampler/ListJobs", code="OK"), text


def test_recovery_and_snapshots_are_logged():
    with tempfile.TemporaryDirectory() as data_dir:
        def drive(client):
            client.create_job("kept", num_samples=16, world_size=1)
            client.end_epoch("kept", 0, 0)
            client.read_shard("kept", 1, 0, 1, observe=True)  # Epoch 1 published; its snapshot follows.
        events, text = run_and_log([f"--data_dir={data_dir}"], drive)
        assert find(events, "recovered", jobs=0, records=0), text
        # The snapshot opening epoch 1 is written off the epoch boundary's path, by shutdown.
        written = find(events, "snapshot_written", job="kept", epoch=1)
        assert written and float(written[0]["snapshot_ms"]) >= 0, text

        events, text = run_and_log([f"--data_dir={data_dir}"], lambda client: None)
        recovered = find(events, "recovered", jobs=1)
        assert recovered and int(recovered[0]["ms"]) >= 0, text
        assert re.fullmatch(r"\d+", recovered[0]["records"]), recovered
