"""The trainer's recipe for a mixture job (samplerd.mixture, docs/INTEGRATIONS.md "Mixture
jobs"): a DDP group (2 processes, gloo, CPU; DataLoader workers) trains on a MixtureDataset over
three domains through a DistributedWeightedSampler of a mixture job on the real samplerd
binary. Every sample a rank gets is the right domain's item for its global index (checked
against offsets computed here, not by the module), each window holds each domain's share, and
every item of a domain comes once per pass over it."""

import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from samplerd._proto import samplerd_pb2 as pb  # noqa: E402
from samplerd.mixture import MixtureDataset  # noqa: E402
from samplerd.torch import DistributedWeightedSampler, IndexedDataset  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

SIZES = [60, 12, 180]   # Domain 1 (12) is smaller than its 20 a window: it wraps in a window.
WEIGHTS = [1.0, 1.0, 2.0]
WINDOW = 80             # Shares 20, 20, 40 of every window.
EPOCHS = 6
WORLD = 2


def _worker(rank, cfg):
    from ddp_group import join_group
    join_group(rank, WORLD, cfg["master_port"])
    try:
        gen = torch.Generator().manual_seed(0)
        # Each domain's item says which domain and which of its items it is.
        domains = [TensorDataset(torch.full((n,), d), torch.arange(n), torch.randn(n, 4,
                                                                                generator=gen))
                   for d, n in enumerate(SIZES)]
        ds = MixtureDataset(domains)
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, len(SIZES)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sampler = DistributedWeightedSampler(cfg["address"], "mixture-trainer",
                                             report_batch_size=32)
        loader = DataLoader(IndexedDataset(ds), sampler=sampler, batch_size=8, num_workers=2,
                            persistent_workers=True)
        served = []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            rows = []
            for idx, (domain, within, x) in loader:
                loss = F.cross_entropy(model(x), domain, reduction="none")
                sampler.report(idx, loss.detach())
                opt.zero_grad()
                loss.mean().backward()
                opt.step()
                rows += zip(idx.tolist(), domain.tolist(), within.tolist())
            served.append(rows)
        sampler.close()
        # Each rank's own record: what it trained on, and its losses' summary.
        with open(f"{cfg['out']}.{rank}", "w") as f:
            json.dump({"served": served, "summary": dict(sampler.last_summary)}, f)
    finally:
        dist.destroy_process_group()


def test_ranks_train_on_each_domains_items_once_per_pass(server, client, tmp_path):
    from ddp_group import run_group
    from ddp_train import free_port
    # The spec from the dataset, as the recipe does (the sizes only: no data is read).
    sizes = MixtureDataset([range(n) for n in SIZES]).group_sizes
    spec = pb.JobSpec(world_size=WORLD, seed=3, samples_per_epoch=WINDOW,
                      mixture=pb.MixtureSpec(group_sizes=sizes, group_weights=WEIGHTS))
    assert client.create_job_from_spec("mixture-trainer", spec).spec.num_samples == sum(SIZES)
    out = tmp_path / "served.json"
    cfg = {"address": server.address, "master_port": free_port(), "out": str(out)}
    assert run_group(_worker, WORLD, cfg) == [0] * WORLD
    reports = [json.loads((tmp_path / f"served.json.{r}").read_text()) for r in range(WORLD)]

    offsets = np.cumsum([0] + SIZES)
    seen = [np.zeros(n, np.int64) for n in SIZES]
    for epoch in range(EPOCHS):
        ranks = [report["served"][epoch] for report in reports]
        assert [len(r) for r in ranks] == [WINDOW // WORLD] * WORLD, f"epoch {epoch}"
        rows = np.array([row for r in ranks for row in r])
        index, domain, within = rows.T
        # The item of global index i is domain k's item i - offset(k).
        expected_domain = np.searchsorted(offsets, index, side="right") - 1
        assert (domain == expected_domain).all(), f"epoch {epoch}"
        assert (within == index - offsets[domain]).all(), f"epoch {epoch}"
        assert np.bincount(domain, minlength=3).tolist() == [20, 20, 40], f"epoch {epoch}"
        for d in range(3):
            # Disjoint ranks: a window that lies within one pass over a domain holds none of
            # its items twice (domain 0 always; domain 2 but in epoch 4, which ends its first
            # pass at 180 and starts the second).
            drawn, share = int(seen[d].sum()), int((domain == d).sum())
            if drawn // SIZES[d] == (drawn + share - 1) // SIZES[d]:
                part = index[domain == d]
                assert len(set(part.tolist())) == len(part), f"epoch {epoch} domain {d}"
            np.add.at(seen[d], within[domain == d], 1)
    # Once per pass: domain 0 took 120 = 2 passes of 60, domain 1 120 = 10 passes of 12, each
    # item exactly that often; domain 2 240 = one pass of 180 and 60 of its second.
    assert (seen[0] == 2).all()
    assert (seen[1] == 10).all()
    assert np.bincount(seen[2]).tolist() == [0, 120, 60]
    for r, report in enumerate(reports):  # Every loss of each rank accepted once.
        assert report["summary"]["accepted"] == EPOCHS * WINDOW // WORLD, f"rank {r}"
        assert report["summary"]["duplicates"] == 0, f"rank {r}"
