"""A samplerd that crashes and is started again by its supervisor 5 s later, as the shipped
systemd unit does (deploy/systemd/samplerd.service: Restart=on-failure, RestartSec=5s): a client
with the default options rides through it -- its calls wait for the restarted server instead of
failing -- and what it had reported before the crash is still there (--data_dir)."""

import threading

import numpy as np

import samplerd
from conftest import SamplerdProcess

RESTART_DELAY_S = 5.0  # RestartSec of deploy/systemd/samplerd.service.


def test_a_default_client_rides_through_a_restart_five_seconds_after_a_crash(tmp_path):
    args = (f"--data_dir={tmp_path}",)
    server = SamplerdProcess(*args)
    port = server.address.rsplit(":", 1)[1]
    restarted = []
    supervisor = threading.Timer(
        RESTART_DELAY_S, lambda: restarted.append(SamplerdProcess(*args, f"--port={port}")))
    try:
        with samplerd.Client(server.address) as c:  # The defaults: 300 s of retries.
            c.create_job("s", num_samples=1000, world_size=1, seed=2, loss="loss")
            shard = c.read_shard("s", 0, 0, 1, observe=True)
            c.report_losses("s", 0, 0, shard[:500], np.ones(500), np.arange(500))
            server.kill()
            supervisor.start()
            # Both wait for the restart: the report of the second half, then the status.
            summary = c.report_losses("s", 0, 0, shard[500:], np.ones(500), np.arange(500, 1000))
            assert summary.accepted == 500
            assert restarted, "the call returned before samplerd came back"
            status = c.status("s")
            assert status.ranks[0].losses_accepted == 1000
            assert status.samples_seen == 1000
    finally:
        supervisor.cancel()
        supervisor.join()
        server.kill()
        for process in restarted:
            process.kill()
