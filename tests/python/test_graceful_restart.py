"""A planned restart of samplerd (SIGTERM: systemctl restart, a rolling update) under a torch
trainer with the client's default options, on the same port and --data_dir.

The sampler holds its shard stream open while training consumes it (prefetch). A shutdown that
let such a stream drain for the whole grace period (10 s) refused the trainer's loss reports
meanwhile ("samplerd is shutting down"), so their retries (~1.55 s) ran out long before the
server came back: a graceful restart failed a trainer that a crash (SIGKILL) did not.
"""

import threading

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
            expected = admin.read_shard("g", 0, 0, 1)
        sampler = DistributedWeightedSampler(server.address, "g", rank=0, world_size=1)
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
