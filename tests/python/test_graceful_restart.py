"""A planned restart of samplerd (SIGTERM: systemctl restart, a rolling update) under a torch
trainer, on the same port and --data_dir, with a retry budget (7 retries, ~5.15 s) shorter than
the grace period (10 s) but long enough for a restart on a loaded machine (~1.55 s, 5 retries, was
not once in CI); the default retries for 300 s.

The sampler holds its shard stream open while training consumes it (prefetch). A shutdown that
let such a stream drain for the whole grace period (10 s) refused the trainer's loss reports
meanwhile ("samplerd is shutting down"), so their retries ran out long before the server came
back: a graceful restart took as long as the grace period, and failed a trainer whose retries
were shorter, which a crash (SIGKILL) did not. And a
call the shutting-down server cancels (one not finished when its drain ended) is sent again.
"""

import threading

import grpc
import numpy as np

import samplerd
from conftest import SamplerdProcess
from samplerd.torch import DistributedWeightedSampler

STEP = 1000


def test_a_torch_trainer_rides_through_a_graceful_restart(tmp_path):
    args = (f"--data_dir={tmp_path}", "--grace_period_ms=10000")
    server = SamplerdProcess(*args)
    port = server.address.rsplit(":", 1)[1]
    restarted, stopper = [], None

    def restart():  # As systemd does: wait for the exit, then start again.
        server.stop()
        restarted.append(SamplerdProcess(*args, f"--port={port}"))

    try:
        with samplerd.Client(server.address) as admin:
            # 2M indices: far more than the sampler prefetches, so its stream stays open.
            admin.create_job("g", num_samples=2_000_000, world_size=1, seed=4, loss="loss")
            expected = admin.read_shard("g", 0, 0, 1, observe=True)
        sampler = DistributedWeightedSampler(server.address, "g", rank=0, world_size=1,
                                             client_options={"max_retries": 7})
        consumed, batch = [], []
        for index in sampler:
            batch.append(index)
            if len(batch) < STEP:
                continue
            sampler.report(batch, np.ones(len(batch)))
            consumed.extend(batch)
            batch = []
            if len(consumed) == 20 * STEP:  # The restart begins while the stream is open.
                stopper = threading.Thread(target=restart)
                stopper.start()
            if len(consumed) == 100 * STEP:
                break
        # Losses reported while the server drained, was down, and came back: all acknowledged.
        sampler.flush()
        stopper.join()
        assert restarted, "samplerd did not come back"
        np.testing.assert_array_equal(consumed, expected[:len(consumed)])
        assert sampler.client.status("g").ranks[0].losses_accepted == len(consumed)
        sampler.close()  # Ends the epoch on the restarted server.
        with samplerd.Client(restarted[0].address) as admin:
            assert admin.get_job("g").current_epoch == 1
    finally:
        if stopper is not None:
            stopper.join()  # Its restarted server, if any, is in `restarted` then.
        server.kill()
        for process in restarted:
            process.kill()


class _CancelledAfterTheServer(grpc.RpcError):
    """What a samplerd shutting down gives a call it had not finished when its drain ended
    (gRPC's Server::Shutdown cancels it): CANCELLED, whether or not it was applied."""

    def code(self):
        return grpc.StatusCode.CANCELLED

    def details(self):
        return "Cancelled"


def test_a_call_the_server_cancelled_is_sent_again_and_counted_once(server):
    with samplerd.Client(server.address) as client:
        client.create_job("c", num_samples=1000, world_size=1, loss="loss")
        shard = client.read_shard("c", 0, 0, 1, observe=True)
        real = client._stub.ReportLosses
        calls = []

        def applied_then_cancelled(requests, timeout=None):
            calls.append(1)
            summary = real(requests, timeout=timeout)  # The real server applies the batch.
            if len(calls) == 1:
                raise _CancelledAfterTheServer()
            return summary
        client._stub.ReportLosses = applied_then_cancelled
        summary = client.report_losses("c", 0, 0, shard[:100], np.ones(100), np.arange(100))
        assert len(calls) == 2
        assert summary.duplicates == 100  # The first send was applied: the retry counts nothing.
        assert client.status("c").ranks[0].losses_accepted == 100
