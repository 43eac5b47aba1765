"""The arms of the policy benchmark (bench/policy_benchmark.py): where each training step's batch
comes from. Every arm is a BatchSource: next_batch(model) gives (indices, importance weights or
None, x, y) for this rank; feedback(indices, losses) gets the batch's per-sample losses (the
samplerd arms report them, the loss-rank arm keeps them); the trainer minimises
(w * loss).mean() (loss.mean() without weights).

  uniform      torch DistributedSampler (shuffle): what a user has without samplerd
  wrs          a per-rank torch WeightedRandomSampler with weights 1/count(class)
  cb           samplerd CLASS_BALANCED (with replacement)
  loss         samplerd LOSS on a uniform base (with replacement)
  loss_is      samplerd LOSS with importance weights: DistributedWeightedSampler(...,
               importance_weights=True); the loss is (w * loss).mean() with w = 1/(N p_i)
  rho_sd       samplerd REDUCIBLE_LOSS: loss="reducible_loss" and the irreducible losses
               uploaded (Client.upload_irreducible_losses); without replacement, M < N (the
               top of each window)
  rho          RHO-LOSS in one trainer (Mindermann et al. 2022): a uniform candidate batch of
               10x the batch, the top 10% by reducible loss (loss - irreducible loss) trained on
  rho_samplerd RHO-LOSS through samplerd, as a user writes it: the candidate batches from a
               DistributedWeightedSampler(..., irreducible_losses=True) of a REDUCIBLE_LOSS job
               with mix = 1 (uniform draws, every sample once an epoch), the top 10% by
               select_reducible, the fresh losses of all candidates reported
  rho_sd_cand  rho_samplerd with the candidates drawn by samplerd's REDUCIBLE_LOSS weights (mix
               0.5 with uniform, with replacement, recomputed every window of M draws from the
               fresh losses of all candidates)
  lossrank     online batch selection by loss rank in one trainer (Loshchilov & Hutter 2015):
               each rank keeps the latest loss of each sample of its partition, ranks them and
               draws with probability falling exponentially with the rank (selection pressure
               s = 100: the highest loss 100x as likely as the lowest)
  cb_loss, cb_loss_groups, cb_mult   the class-balance x loss combinations of the first
               version of this benchmark (not in the default list; --arms selects them)
  rho_sd_floor rho_sd with the effective-sample-size floor min_effective_fraction = 0.5 (not in
               the default list)

The irreducible losses (rho, rho_sd) come from irreducible_losses(): a model of the same shape
trained on the holdout split and evaluated once on every training sample.
"""

import inspect
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import (DataLoader, DistributedSampler, TensorDataset,
                              WeightedRandomSampler)

import samplerd
from samplerd.torch import DistributedWeightedSampler, IndexedDataset

try:
    from samplerd.torch import select_reducible
except ImportError:  # A client without it: the candidate arms are skipped (supports).
    select_reducible = None

ARMS = ("uniform", "wrs", "cb", "loss", "loss_is", "rho_sd", "rho", "rho_samplerd",
        "rho_sd_cand", "lossrank")
EXTRA_ARMS = ("cb_loss", "cb_loss_groups", "cb_mult", "rho_sd_floor")
# The LOSS settings of every samplerd loss arm (the demo's: examples/ddp_train.py).
LOSS_PARAMS = dict(ema_decay=0.5, alpha=1.0, mix=0.1, clamp_hi=20.0)
# Per samplerd arm: the create_job policy, and whether it draws with replacement.
SAMPLERD_ARMS = {
    "cb": (dict(base="class_balanced"), True),
    "loss": (dict(loss="loss", **LOSS_PARAMS), True),
    "loss_is": (dict(loss="loss", **LOSS_PARAMS), True),
    "rho_sd": (dict(loss="reducible_loss", **LOSS_PARAMS), False),
    "rho_sd_floor": (dict(loss="reducible_loss", min_effective_fraction=0.5, **LOSS_PARAMS),
                     False),
    "cb_loss": (dict(base="class_balanced", loss="loss", **LOSS_PARAMS), True),
    "cb_loss_groups": (dict(base="class_balanced", loss="loss", loss_within_groups=True,
                            **LOSS_PARAMS), True),
    "cb_mult": (dict(base="class_balanced", loss="multiplicative", eta=0.1, clamp_hi=20.0), True),
    "rho_samplerd": (dict(loss="reducible_loss", mix=1.0), False),
    "rho_sd_cand": (dict(loss="reducible_loss", **dict(LOSS_PARAMS, mix=0.5)), True),
}
# The samplerd arms whose batches are candidate batches (RHO-LOSS's selection in the trainer).
CANDIDATE_ARMS = ("rho_samplerd", "rho_sd_cand")
NEEDS_IRREDUCIBLE = ("rho", "rho_sd", "rho_sd_floor") + CANDIDATE_ARMS
RHO_CANDIDATES = 10       # RHO-LOSS: candidate batch / trained batch (the paper's 10%).
SELECTION_PRESSURE = 100.0  # Loss-rank selection: p(first rank) / p(last rank).
RESORT_EVERY = 10         # Loss-rank selection: steps between two sorts of the kept losses.


def make_model(seed, features, classes, hidden=128):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, classes))


def balanced_accuracy(model, x, y, classes):
    """(mean per-class recall, the recalls)."""
    with torch.no_grad():
        pred = model(x).argmax(dim=1)
    rec = [float((pred[y == c] == c).float().mean()) for c in range(classes)]
    return float(np.mean(rec)), rec


def irreducible_losses(data, seed, steps, batch_size=64, lr=1e-3):
    """The irreducible loss of every training sample, RHO-LOSS's way: a small model trained on
    the holdout split only, evaluated once on each training sample. Returns (losses [n],
    the model's balanced test accuracy)."""
    model = make_model(seed + 7919, data.x.shape[1], data.classes)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed + 7919)
    for _ in range(steps):
        i = torch.randint(len(data.y_hold), (batch_size,), generator=g)
        loss = F.cross_entropy(model(data.x_hold[i]), data.y_hold[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        il = F.cross_entropy(model(data.x), data.y, reduction="none")
    return il, balanced_accuracy(model, data.x_test, data.y_test, data.classes)[0]


def supports(address):
    """Per samplerd arm whose API may be missing here: None if the client and the server
    support it, else why not (printed when the arm is skipped)."""
    reasons = {}
    params = inspect.signature(DistributedWeightedSampler.__init__).parameters
    reasons["loss_is"] = (None if "importance_weights" in params else
                          "this client's DistributedWeightedSampler has no importance_weights "
                          "argument (issue 34 part 2)")
    if not hasattr(samplerd.Client, "upload_irreducible_losses"):
        reasons["rho_sd"] = ("this client has no Client.upload_irreducible_losses "
                             "(issue 34 part 1)")
    else:
        probe = "policy-benchmark-probe"
        try:
            with samplerd.Client(address) as c:
                c.create_job(probe, num_samples=4, world_size=1, samples_per_epoch=2,
                             **SAMPLERD_ARMS["rho_sd"][0])
                try:
                    c.upload_irreducible_losses(probe, np.zeros(4, dtype=np.float32))
                finally:
                    c.delete_job(probe)
            reasons["rho_sd"] = None
        except Exception as e:  # noqa: BLE001 -- any refusal means the arm cannot run here.
            reasons["rho_sd"] = (f"the server or client refused loss=\"reducible_loss\": "
                                 f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    reasons["rho_sd_floor"] = reasons["rho_sd"]
    if "irreducible_losses" not in params:
        why = ("this client's DistributedWeightedSampler has no irreducible_losses argument "
               "(RHO-LOSS through samplerd)")
    else:
        why = reasons["rho_sd"] or _streams_irreducible(address)
    reasons.update({arm: why for arm in CANDIDATE_ARMS})
    return reasons


def _streams_irreducible(address):
    """None if the server streams irreducible losses beside the indices, else why not (a
    server without StreamShardRequest.with_irreducible_losses ignores the field)."""
    probe = "policy-benchmark-probe-stream"
    with samplerd.Client(address) as c:
        c.create_job(probe, num_samples=4, world_size=1, **SAMPLERD_ARMS["rho_samplerd"][0])
        try:
            c.upload_irreducible_losses(probe, np.arange(4, dtype=np.float32))
            chunk = next(c.stream_shard(probe, 0, 0, 1, with_irreducible_losses=True,
                                        observe=True))
        finally:
            c.delete_job(probe)
    if chunk.irreducible_losses is None or len(chunk.irreducible_losses) != len(chunk.indices):
        return "the server does not stream irreducible losses (with_irreducible_losses)"
    return None


def _epochs(loader, sampler):
    """The loader's batches, epoch after epoch (set_epoch on the sampler first)."""
    epoch = 0
    while True:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


class SamplerSource:
    """uniform, wrs and the samplerd arms: a sampler and a DataLoader, as a user writes it."""

    def __init__(self, arm, cfg, data, seed, rank, world, address, il, job):
        n, batch = len(data.y), cfg["batch_size"]
        self.sampler, self.job, self.address, self.rank = None, None, address, rank
        # The torch arms' items carry their index too (the share of mislabelled draws).
        dataset = TensorDataset(torch.arange(n), data.x, data.y)
        if arm == "uniform":
            self.sampler = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                              shuffle=True, seed=seed)
        elif arm == "wrs":
            counts = torch.bincount(data.y, minlength=data.classes).double()
            self.sampler = WeightedRandomSampler(
                (1.0 / counts)[data.y], num_samples=-(-n // world), replacement=True,
                generator=torch.Generator().manual_seed(seed * 97 + rank))
        else:
            policy, replacement = SAMPLERD_ARMS[arm]
            self.job = job
            # With replacement, M = the window (0: N, if the window is not smaller). Without,
            # M = N would draw every sample once and ignore the weights: at most a tenth of N
            # (RHO-LOSS's 10%); but the uniform candidate arm draws every sample once an epoch
            # (M = N), as DistributedSampler does.
            if replacement:
                m = cfg["window"] if cfg["window"] < n else 0
            elif arm in CANDIDATE_ARMS:
                m = 0
            else:
                m = max(world, min(cfg["window"], n // 10))
            if rank == 0:
                with samplerd.Client(address) as c:
                    c.create_job(job, num_samples=n, world_size=world, seed=seed,
                                 replacement=replacement, samples_per_epoch=m, **policy)
                    if policy.get("base") == "class_balanced":
                        c.upload_labels(job, data.y.numpy())
                    if policy.get("loss") == "reducible_loss":
                        c.upload_irreducible_losses(job, il.numpy())
            torch.distributed.barrier()
            extra = {"importance_weights": True} if arm == "loss_is" else {}
            if arm in CANDIDATE_ARMS:
                extra = {"irreducible_losses": True}
            self.sampler = DistributedWeightedSampler(address, job, rank, world,
                                                      report_batch_size=256, **extra)
            dataset = IndexedDataset(TensorDataset(data.x, data.y))
        self.candidates = arm in CANDIDATE_ARMS
        self.batch = batch
        loader_batch = batch * RHO_CANDIDATES if self.candidates else batch
        self.batches = _epochs(DataLoader(dataset, sampler=self.sampler, batch_size=loader_batch),
                               self.sampler)
        self.forward_per_step = batch * (RHO_CANDIDATES + 1) if self.candidates else batch

    def next_batch(self, model):
        batch = next(self.batches)
        if self.job is None:
            idx, xb, yb = batch
            return idx, None, xb, yb
        if self.candidates:  # irreducible_losses=True: (index, irreducible loss, sample)
            idx, il, (xc, yc) = batch
            with torch.no_grad():
                losses = F.cross_entropy(model(xc), yc, reduction="none")
            self.sampler.report(idx, losses)  # Every candidate's loss, fresh.
            top = select_reducible(losses, il, self.batch)
            return idx[top], None, xc[top], yc[top]
        if len(batch) == 3:  # importance_weights=True: (index, weight, sample)
            idx, w, (xb, yb) = batch
            return idx, w.float(), xb, yb
        idx, (xb, yb) = batch
        return idx, None, xb, yb

    def feedback(self, idx, losses):
        # The candidate arms reported every candidate's loss in next_batch already.
        if self.job is not None and not self.candidates:
            self.sampler.report(idx, losses)

    def close(self):
        if self.job is not None:
            with warnings.catch_warnings():
                # A run ends after its step budget, mid-epoch by design: the positions left
                # without a loss are what the RestartWarning is about.
                warnings.simplefilter("ignore", samplerd.RestartWarning)
                self.sampler.close()
            torch.distributed.barrier()  # Every rank is done: delete it (the server caps jobs).
            if self.rank == 0:
                with samplerd.Client(self.address) as c:
                    c.delete_job(self.job)


class RhoLossSource:
    """RHO-LOSS in one trainer: the top 1/RHO_CANDIDATES of a uniform candidate batch by
    reducible loss = training loss - irreducible loss."""

    def __init__(self, cfg, data, seed, rank, world, il):
        dataset = TensorDataset(torch.arange(len(data.y)), data.x, data.y)
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                     seed=seed)
        self.batch = cfg["batch_size"]
        self.batches = _epochs(DataLoader(dataset, sampler=sampler,
                                          batch_size=self.batch * RHO_CANDIDATES), sampler)
        self.il = il
        self.forward_per_step = self.batch * (RHO_CANDIDATES + 1)

    def next_batch(self, model):
        idx, xc, yc = next(self.batches)
        with torch.no_grad():
            reducible = F.cross_entropy(model(xc), yc, reduction="none") - self.il[idx]
        top = reducible.topk(min(self.batch, len(idx))).indices
        return idx[top], None, xc[top], yc[top]

    def feedback(self, idx, losses):
        pass

    def close(self):
        pass


class LossRankSource:
    """Loshchilov & Hutter's online batch selection: this rank's partition (every world-th
    sample of a seeded permutation, as DistributedSampler deals), the latest loss of each
    sample (first from one forward pass of the initial model), sorted every RESORT_EVERY
    steps; a batch draws rank r with probability proportional to exp(-ln(s) r / n)."""

    def __init__(self, cfg, data, seed, rank, world, model):
        perm = torch.randperm(len(data.y), generator=torch.Generator().manual_seed(seed))
        self.part = perm[rank::world]
        self.x, self.y = data.x, data.y
        with torch.no_grad():
            self.losses = F.cross_entropy(model(self.x[self.part]), self.y[self.part],
                                          reduction="none")
        n = len(self.part)
        self.p = torch.exp(-np.log(SELECTION_PRESSURE) * torch.arange(n, dtype=torch.float64)
                           / n)
        self.g = torch.Generator().manual_seed(seed * 131 + rank)
        self.batch, self.steps, self.order = cfg["batch_size"], 0, None
        self.forward_per_step = self.batch
        self.positions = None

    def next_batch(self, model):
        if self.steps % RESORT_EVERY == 0:
            self.order = torch.argsort(self.losses, descending=True)
        self.steps += 1
        ranks = torch.multinomial(self.p, self.batch, replacement=True, generator=self.g)
        self.positions = self.order[ranks]
        idx = self.part[self.positions]
        return idx, None, self.x[idx], self.y[idx]

    def feedback(self, idx, losses):
        self.losses[self.positions] = losses

    def close(self):
        pass


def make_source(arm, cfg, data, seed, rank, world, address, il, model, job):
    if arm == "rho":
        return RhoLossSource(cfg, data, seed, rank, world, il)
    if arm == "lossrank":
        return LossRankSource(cfg, data, seed, rank, world, model)
    return SamplerSource(arm, cfg, data, seed, rank, world, address, il, job)
