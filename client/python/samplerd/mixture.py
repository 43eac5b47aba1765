"""The trainer's side of a mixture job: a global index -> (group, index in its group).

A mixture job (JobSpec.mixture, docs/SAMPLING.md "Mixture jobs") numbers its samples group
after group: group k holds the global indices [offset(k), offset(k) + size(k)), the offsets the
prefix sums of MixtureSpec.group_sizes in group order. The sampler yields global indices; the
trainer maps each back to its source with GroupLayout (the rule of the server's
kernels/mixture/window.h GroupLayout), or lets MixtureDataset do it:

    domains = [wiki, code, books]                      # any objects with __len__ and __getitem__
    ds = MixtureDataset(domains)
    client.create_job_from_spec("mix", pb.JobSpec(world_size=2, samples_per_epoch=4096,
                                mixture=pb.MixtureSpec(group_sizes=ds.group_sizes)))
    loader = DataLoader(IndexedDataset(ds), sampler=DistributedWeightedSampler(ADDR, "mix"))

    layout = GroupLayout([3, 5])
    layout.locate(4)                                   # (1, 1)
    layout.locate(np.array([0, 2, 3, 7]))              # (array([0, 0, 1, 1]), array([0, 2, 0, 4]))

docs/INTEGRATIONS.md ("Mixture jobs") has the recipes: HF `datasets` (concatenate_datasets, or a
MixtureDataset over the per-source datasets) and a Megatron-style indexed dataset (per-domain
.bin/.idx files).
Needs numpy only (a torch tensor of indices is mapped too, and gives torch tensors back).
"""

import itertools
import operator
from typing import Any, List, Sequence, Tuple

import numpy as np

from . import errors

# A mixture job's samples: at most 2^63 (server/mixture_config.h, JobSpec.num_samples).
_MAX_TOTAL = 1 << 63


def _as_int(name: str, value: Any, expected: str) -> int:
    """value as an int (numpy ints and 0-d tensors too; not a bool, a float or anything else):
    InvalidArgument "name = value: must be <expected>" otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise errors.InvalidArgument(f"{name} = {value!r}: must be {expected}")


class GroupLayout:
    """Groups of the given sizes laid out one after another in the global index space.

    Args:
        group_sizes: n_0, ..., n_{K-1}, each an int >= 1 (numpy ints too), in the job's group
            order (MixtureSpec.group_sizes). The server caps K (1,000,000: MixtureSpec); a layout
            has no cap of its own.

    Raises:
        InvalidArgument (a ValueError): no group; a size that is not an int, or < 1 (naming the
            group and the value); sizes adding up to more than 2^63 (naming the group where
            the sum passes it).
    """

    def __init__(self, group_sizes: Sequence[int]):
        sizes: List[int] = []
        for k, size in enumerate(group_sizes):
            size = _as_int(f"group_sizes[{k}]", size, "an int >= 1")
            if size < 1:
                raise errors.InvalidArgument(
                    f"group_sizes[{k}] = {size}: a group holds at least 1 sample")
            sizes.append(size)
        if not sizes:
            raise errors.InvalidArgument("group_sizes is empty: a mixture has at least 1 group")
        offsets = [0] + list(itertools.accumulate(sizes))
        if offsets[-1] > _MAX_TOTAL:
            k = next(k for k, end in enumerate(offsets[1:]) if end > _MAX_TOTAL)
            raise errors.InvalidArgument(
                f"group_sizes[{k}] = {sizes[k]}: the sizes up to group {k} add up to "
                f"{offsets[k + 1]}, more than 2^63 samples")
        self._sizes = sizes
        # uint64: the total may be 2^63 itself; searchsorted gets uint64 queries (int64 against
        # uint64 would compare as float64, which is not exact past 2^53).
        self._offsets = np.array(offsets, dtype=np.uint64)

    @property
    def groups(self) -> int:
        """K."""
        return len(self._sizes)

    @property
    def group_sizes(self) -> List[int]:
        """n_0, ..., n_{K-1}: MixtureSpec.group_sizes of the job."""
        return list(self._sizes)

    @property
    def total(self) -> int:
        """N = the sum of the sizes: the job's num_samples."""
        return int(self._offsets[-1])

    def size(self, k: int) -> int:
        """n_k. InvalidArgument unless 0 <= k < K."""
        return self._sizes[self._group(k)]

    def offset(self, k: int) -> int:
        """The global index of group k's first sample. InvalidArgument unless 0 <= k < K."""
        return int(self._offsets[self._group(k)])

    def locate(self, index: Any) -> Tuple[Any, Any]:
        """(group, index in group) of a global index: the k with offset(k) <= i < offset(k + 1),
        and i - offset(k).

        `index` an int (numpy ints too): two ints. An array of ints (numpy, or anything
        np.asarray takes: a list): two int64 arrays of its shape. A torch tensor of ints: two
        int64 tensors. O(log K) per index (a binary search on the offsets).

        Raises:
            InvalidArgument: an index that is not an integer, or not in [0, total) (naming the
                first such one: its position in the array and its value).
        """
        if type(index).__module__ == "torch":  # Without importing torch: a Tensor.
            import torch
            groups, within = self._locate_array(index.detach().cpu().numpy())
            return torch.from_numpy(groups), torch.from_numpy(within)
        if isinstance(index, (np.ndarray, list, tuple)):
            return self._locate_array(np.asarray(index))
        i = _as_int("index", index, f"an int in [0, {self.total})")
        if not 0 <= i < self.total:
            raise errors.InvalidArgument(
                f"index = {i}: not in [0, {self.total}) (the {self.groups} groups hold "
                f"{self.total} samples)")
        k = int(np.searchsorted(self._offsets, np.uint64(i), side="right")) - 1
        return k, i - int(self._offsets[k])

    def _locate_array(self, index: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        if index.size == 0:
            return (np.zeros(index.shape, np.int64), np.zeros(index.shape, np.int64))
        if not np.issubdtype(index.dtype, np.integer):
            raise errors.InvalidArgument(
                f"index of dtype {index.dtype}: must be integers in [0, {self.total})")
        flat = index.reshape(-1)
        bad = np.flatnonzero(flat < 0) if np.issubdtype(index.dtype, np.signedinteger) else []
        if len(bad) == 0:
            flat = flat.astype(np.uint64)
            bad = np.flatnonzero(flat >= self._offsets[-1])
        if len(bad):
            p = int(bad[0])
            raise errors.InvalidArgument(
                f"index[{p}] = {index.reshape(-1)[p]}: not in [0, {self.total}) (the "
                f"{self.groups} groups hold {self.total} samples; {len(bad)} such indices)")
        groups = np.searchsorted(self._offsets, flat, side="right").astype(np.int64) - 1
        within = (flat - self._offsets[groups]).astype(np.int64)
        return groups.reshape(index.shape), within.reshape(index.shape)

    def _group(self, k: Any) -> int:
        k = _as_int("group", k, f"an int in [0, {self.groups})")
        if not 0 <= k < self.groups:
            raise errors.InvalidArgument(f"group = {k}: not in [0, {self.groups})")
        return k

    def __repr__(self) -> str:
        return f"GroupLayout(groups={self.groups}, total={self.total})"


class MixtureDataset:
    """A map-style dataset over K per-domain datasets laid out as a mixture job's groups:
    item i is domains[k][j] for (k, j) = layout.locate(i). Works with DataLoader (and
    IndexedDataset) as any map-style dataset does.

    Args:
        domains: K objects with __len__ and __getitem__ (torch Datasets, HF `datasets`
            Datasets, the per-domain readers of an indexed corpus), in the job's group order.
            Each holds at least 1 sample.

    Raises:
        InvalidArgument: no domain, a domain without __len__ / __getitem__ or of length 0
            (naming it); at __getitem__, an index not in [0, len) (naming it).
    """

    def __init__(self, domains: Sequence[Any]):
        domains = list(domains)
        if not domains:
            raise errors.InvalidArgument("domains is empty: a mixture has at least 1 domain")
        sizes = []
        for k, d in enumerate(domains):
            if not (hasattr(d, "__len__") and hasattr(d, "__getitem__")):
                raise errors.InvalidArgument(
                    f"domains[{k}] ({type(d).__name__}): needs __len__ and __getitem__")
            sizes.append(len(d))
            if sizes[-1] < 1:
                raise errors.InvalidArgument(
                    f"domains[{k}] ({type(d).__name__}) is empty: each domain is a group of "
                    f"the job, and a group holds at least 1 sample")
        self.layout = GroupLayout(sizes)
        self.domains = domains

    @property
    def group_sizes(self) -> List[int]:
        """The domains' lengths: MixtureSpec.group_sizes of the job."""
        return self.layout.group_sizes

    def __len__(self) -> int:
        return self.layout.total

    def __getitem__(self, index: Any) -> Any:
        try:  # One index: an int, a numpy int or a 0-d tensor.
            index = operator.index(index)
        except TypeError:
            pass  # locate() names it.
        k, j = self.layout.locate(index)
        return self.domains[k][j]
