"""samplerd: the Python client of the samplerd sampler coordination service.

    import samplerd
    with samplerd.Client("127.0.0.1:50051") as client:
        client.create_job("train", num_samples=50_000, world_size=4,
                          samples_per_epoch=10_000, loss="loss")

For PyTorch, see samplerd.torch (DistributedWeightedSampler, IndexedDataset); for Lightning,
Accelerate, the Transformers Trainer and torchdata, samplerd.lightning, samplerd.accelerate,
samplerd.transformers and samplerd.torchdata (docs/INTEGRATIONS.md; each is imported on its own).
For mixture jobs, GroupLayout and MixtureDataset (samplerd.mixture): a global index -> (group,
index in group).
"""

from .client import Client, Policy, RankClaim, ShardChunk, check_loss_batch
from .errors import (Aborted, AlreadyExists, DataLoss, DeadlineExceeded, FailedPrecondition,
                     InvalidArgument, NotFound, PermissionDenied, ResourceExhausted,
                     RestartWarning, SamplerError, Unauthenticated, Unavailable)
from .mixture import GroupLayout, MixtureDataset

__all__ = [
    "Client", "Policy", "RankClaim", "ShardChunk", "check_loss_batch", "SamplerError",
    "InvalidArgument", "Aborted",
    "NotFound", "AlreadyExists", "FailedPrecondition", "ResourceExhausted", "DeadlineExceeded",
    "Unavailable", "DataLoss", "Unauthenticated", "PermissionDenied", "RestartWarning",
    "GroupLayout", "MixtureDataset",
]
__version__ = "0.1.0"
