"""RHO-LOSS's selection (Mindermann et al. 2022) in the trainer: of a candidate batch, the samples
of largest reducible loss = training loss - irreducible loss.

The candidates come from a DistributedWeightedSampler with irreducible_losses=True (a
loss="reducible_loss" job: mix=1.0 draws them uniformly, as the paper does); the trainer
computes the candidates' losses without gradients, keeps the top k and trains on those, and
reports the losses of every candidate (they are all fresh):

    sampler = DistributedWeightedSampler(ADDR, job="train", irreducible_losses=True)
    loader = DataLoader(IndexedDataset(ds), sampler=sampler, batch_size=10 * B)
    for idx, irreducible, (x, y) in loader:
        with torch.no_grad():
            losses = F.cross_entropy(model(x), y, reduction="none")
        sampler.report(idx, losses)
        top = select_reducible(losses, irreducible, B)
        F.cross_entropy(model(x[top]), y[top]).backward(); opt.step(); opt.zero_grad()

docs/POLICIES.md ("RHO-LOSS through samplerd") has what it measured.
"""

import torch

from . import errors


def select_reducible(losses: torch.Tensor, irreducible: torch.Tensor, k: int) -> torch.Tensor:
    """The positions (int64, into the candidate batch) of the k candidates of largest
    reducible loss losses[i] - irreducible[i], largest first.

    Args:
        losses: the candidates' training losses, 1-D, finite (computed without gradients).
        irreducible: their irreducible losses, the same shape (the float32 tensor that
            IndexedDataset gives a batch of a sampler with irreducible_losses=True).
        k: how many to keep, >= 1. A candidate batch of at most k samples (an epoch's last
            batch) is kept whole, in the same order (largest first).

    Raises:
        InvalidArgument: k < 1; shapes that differ or are not 1-D; a loss or irreducible loss
            that is not finite (naming its position and value).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise errors.InvalidArgument(f"k = {k!r}: must be an int >= 1")
    losses = torch.as_tensor(losses)
    irreducible = torch.as_tensor(irreducible)
    if losses.dim() != 1 or losses.shape != irreducible.shape:
        raise errors.InvalidArgument(
            f"losses of shape {tuple(losses.shape)} and irreducible of shape "
            f"{tuple(irreducible.shape)}: both must be 1-D and of the same length (one per "
            f"candidate)")
    for name, values in (("losses", losses), ("irreducible", irreducible)):
        bad = (~torch.isfinite(values)).nonzero()
        if len(bad):
            i = int(bad[0])
            raise errors.InvalidArgument(f"{name}[{i}] = {float(values[i])}: must be finite")
    reducible = losses.detach().double() - irreducible.detach().double()
    return reducible.topk(min(k, len(reducible))).indices
