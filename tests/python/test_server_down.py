"""A torch trainer whose samplerd is killed and stays down, with the client's default options but
a short retry budget (~1.55 s, where the default waits 300 s for a restart): every call of the
sampler fails within its retries (no hang, close included), and each error
says where the trainer stopped -- the job, epoch, rank and shard position -- as the C++ trainer
library's do, not only gRPC's "failed to connect to all addresses"."""

import numpy as np
import pytest

import samplerd
from conftest import SamplerdProcess
from samplerd.torch import DistributedWeightedSampler


def test_a_sampler_whose_server_stays_down_fails_naming_job_epoch_rank_and_position():
    server = SamplerdProcess()
    try:
        with samplerd.Client(server.address) as admin:
            # Far more than the sampler prefetches: the stream must be reopened to go on.
            admin.create_job("down", num_samples=8_000_000, world_size=2, seed=8, loss="loss")
        sampler = DistributedWeightedSampler(server.address, "down", rank=1, world_size=2,
                                             client_options={"max_retries": 5})
        iterator = iter(sampler)
        served = [next(iterator) for _ in range(100)]
        server.kill()

        # The losses of positions 0..99, sent in the background: flush says which failed.
        sampler.report(served, np.ones(len(served)))
        with pytest.raises(samplerd.Unavailable) as flushed:
            sampler.flush()
        assert "job 'down' epoch 0 rank 1" in str(flushed.value)
        assert "positions 0 to 99" in str(flushed.value)

        # Reading on: the prefetched indices, then the reopened stream fails at its position.
        with pytest.raises(samplerd.Unavailable) as read:
            for _ in iterator:
                pass
        message = str(read.value)
        assert "job 'down' epoch 0 rank 1: shard stream failed at position " in message
        position = int(message.split("failed at position ")[1].split(":")[0])
        assert 100 < position < 4_000_000  # After what was served, before the shard's end.

        # Closing ends the epoch, which cannot be done either: it says so and returns.
        with pytest.raises(samplerd.Unavailable) as closed:
            sampler.close()
        assert "job 'down' epoch 0 rank 1: EndEpoch" in str(closed.value)
    finally:
        server.kill()
