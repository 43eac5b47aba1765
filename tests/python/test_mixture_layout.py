"""samplerd.mixture without a server: GroupLayout maps a mixture job's global index to (group,
index in group) as the server lays the groups out (group after group, in MixtureSpec order),
exactly up to 2^63 samples, and MixtureDataset serves domains[k][j] for it. The same module
over the real server and DDP ranks: tests/python/test_mixture.py."""

import numpy as np
import pytest

import samplerd
from samplerd.mixture import GroupLayout, MixtureDataset


def _brute(sizes, i):
    """The (group, index in group) of global index i, by walking the groups."""
    for k, n in enumerate(sizes):
        if i < n:
            return k, i
        i -= n
    raise AssertionError("past the end")


@pytest.mark.parametrize("sizes", [[1], [5], [3, 5], [1, 1, 1, 1], [7, 1, 2, 40, 1],
                                   list(range(1, 30))])
def test_every_index_maps_to_its_group_scalar_and_vectorised(sizes):
    layout = GroupLayout(sizes)
    n = sum(sizes)
    assert layout.total == n and layout.groups == len(sizes)
    assert [layout.offset(k) for k in range(len(sizes))] == list(np.cumsum([0] + sizes[:-1]))
    assert [layout.size(k) for k in range(len(sizes))] == sizes
    expected = [_brute(sizes, i) for i in range(n)]
    assert [layout.locate(i) for i in range(n)] == expected
    assert all(type(g) is int and type(j) is int for g, j in map(layout.locate, range(n)))
    # An array of any shape and integer dtype: the same, elementwise, int64.
    for dtype in (np.int64, np.uint32, np.int16):
        idx = np.arange(n, dtype=dtype)[::-1].reshape(-1, 1)
        g, j = layout.locate(idx)
        assert g.shape == j.shape == idx.shape and g.dtype == j.dtype == np.int64
        assert list(zip(g.ravel().tolist(), j.ravel().tolist())) == expected[::-1]
    assert [tuple(map(int, x)) for x in zip(*layout.locate(list(range(n))))] == expected


def test_a_torch_tensor_gives_torch_tensors():
    torch = pytest.importorskip("torch")
    layout = GroupLayout([3, 5])
    g, j = layout.locate(torch.tensor([0, 2, 3, 7]))
    assert isinstance(g, torch.Tensor) and g.dtype == torch.int64
    assert g.tolist() == [0, 0, 1, 1] and j.tolist() == [0, 2, 0, 4]
    g, j = layout.locate(torch.tensor(4))  # 0-d: 0-d tensors
    assert g.dim() == 0 and (g.item(), j.item()) == (1, 1)


def test_exact_at_two_to_the_63():
    """Offsets past 2^53 (where float64 stops being exact) and a total of exactly 2^63: a
    search that compared as float64 would put the last indices in the wrong group."""
    half = 1 << 62
    layout = GroupLayout([half - 1, 1, half])
    assert layout.total == 1 << 63
    assert layout.locate(half - 2) == (0, half - 2)
    assert layout.locate(half - 1) == (1, 0)
    assert layout.locate(half) == (2, 0)
    assert layout.locate((1 << 63) - 1) == (2, half - 1)
    g, j = layout.locate(np.array([half - 2, half - 1, half, (1 << 63) - 1], dtype=np.int64))
    assert g.tolist() == [0, 1, 2, 2]
    assert j.tolist() == [half - 2, 0, 0, half - 1]
    g, j = layout.locate(np.array([(1 << 63) - 1], dtype=np.uint64))
    assert (g.tolist(), j.tolist()) == ([2], [half - 1])


@pytest.mark.parametrize("sizes, message", [
    ([], "group_sizes is empty"),
    ([4, 0, 2], r"group_sizes\[1\] = 0: a group holds at least 1 sample"),
    ([4, -3], r"group_sizes\[1\] = -3"),
    ([4, 2.0], r"group_sizes\[1\] = 2.0: must be an int"),
    ([True], r"group_sizes\[0\] = True: must be an int"),
    ([1 << 62, 1 << 62, 1], r"group_sizes\[2\] = 1: the sizes up to group 2 add up to "
                            r"9223372036854775809, more than 2\^63"),
])
def test_bad_sizes_name_the_group_and_value(sizes, message):
    with pytest.raises(samplerd.InvalidArgument, match=message) as e:
        GroupLayout(sizes)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("index, message", [
    (8, r"index = 8: not in \[0, 8\) \(the 2 groups hold 8 samples\)"),
    (-1, r"index = -1: not in \[0, 8\)"),
    (2.0, r"index = 2.0: must be an int in \[0, 8\)"),
    (np.array([1, 9, 10]), r"index\[1\] = 9: not in \[0, 8\) .*2 such indices"),
    (np.array([[3, -2]]), r"index\[1\] = -2: not in \[0, 8\)"),
    (np.array([1.0]), r"index of dtype float64: must be integers"),
])
def test_bad_indices_name_the_position_and_value(index, message):
    with pytest.raises(samplerd.InvalidArgument, match=message):
        GroupLayout([3, 5]).locate(index)


def test_bad_groups_are_refused():
    layout = GroupLayout([3, 5])
    for k in (2, -1):
        with pytest.raises(samplerd.InvalidArgument, match=rf"group = {k}: not in \[0, 2\)"):
            layout.offset(k)


def test_an_empty_array_maps_to_empty_arrays():
    g, j = GroupLayout([3]).locate(np.zeros(0, np.int64))
    assert g.shape == j.shape == (0,)


def test_mixture_dataset_serves_each_domains_item():
    domains = [[("a", j) for j in range(3)], [("b", j) for j in range(1)],
               [("c", j) for j in range(4)]]
    ds = MixtureDataset(domains)
    assert ds.group_sizes == [3, 1, 4] and len(ds) == 8
    assert [ds[i] for i in range(8)] == [x for d in domains for x in d]
    assert ds[np.int64(3)] == ("b", 0)
    torch = pytest.importorskip("torch")
    assert ds[torch.tensor(4)] == ("c", 0)
    with pytest.raises(samplerd.InvalidArgument, match=r"index = 8: not in \[0, 8\)"):
        ds[8]


@pytest.mark.parametrize("domains, message", [
    ([], "domains is empty"),
    ([[1], []], r"domains\[1\] \(list\) is empty"),
    ([[1], 5], r"domains\[1\] \(int\): needs __len__ and __getitem__"),
])
def test_mixture_dataset_refuses_what_is_no_group(domains, message):
    with pytest.raises(samplerd.InvalidArgument, match=message):
        MixtureDataset(domains)
