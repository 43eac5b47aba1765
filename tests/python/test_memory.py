"""Memory through the real samplerd binary: admission by memory, and what a job does not need.

Issue 9, defect 1: a CreateJob that could not be allocated threw out of the server (UNKNOWN),
leaking its name, a --max_jobs slot and an empty job directory. Defect 4: a UNIFORM job with
replacement held 8 bytes per sample although uniform draws need no per-sample state.
"""

import os
import resource

import pytest

import samplerd
from conftest import SamplerdProcess

# The spec: one sample drawn 2^36 times per epoch (a 256 GiB plan, 520 GiB estimated).
UNALLOCATABLE = dict(num_samples=1, world_size=1, samples_per_epoch=1 << 36, replacement=True)
# Two plans of 4-byte indices; one rank: 64 bytes and a bit per shard position.
UNALLOCATABLE_ESTIMATE = 2 * 4 * (1 << 36) + 64 + (1 << 36) // 8


def default_budget_upper_bound():
    """80% of physical memory: the default --max_memory_bytes, or more (a cgroup lowers it)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 4 // 5


def address_space_limit(limit_bytes):
    """A preexec_fn capping the server's virtual memory: an allocation beyond it fails at once
    (std::bad_alloc) instead of touching this shared machine's memory."""
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


def job_dirs(data_dir):
    jobs = os.path.join(data_dir, "jobs")
    return sorted(os.listdir(jobs)) if os.path.isdir(jobs) else []


def check_nothing_left_behind(c, data_dir):
    """After the failed creates of "big" and "big2" with --max_jobs=3: no job, no directory;
    both names and all 3 slots are free again."""
    assert c.list_jobs() == []
    assert job_dirs(data_dir) == []
    for name in ["big", "big2"]:
        with pytest.raises(samplerd.NotFound):
            c.delete_job(name)
    for name in ["big", "big2", "third"]:
        c.create_job(name, num_samples=100, world_size=1)
    assert [j.name for j in c.list_jobs()] == ["big", "big2", "third"]
    assert job_dirs(data_dir) == ["big", "big2", "third"]


def test_a_job_over_the_memory_budget_is_refused_and_leaves_nothing(tmp_path):
    if default_budget_upper_bound() >= UNALLOCATABLE_ESTIMATE:
        pytest.skip("this machine has room for the issue's 512 GiB job")
    data_dir = str(tmp_path / "data")
    server = SamplerdProcess("--max_jobs=3", f"--data_dir={data_dir}")
    try:
        with samplerd.Client(server.address, timeout=20) as c:
            for name in ["big", "big", "big2"]:
                with pytest.raises(samplerd.ResourceExhausted) as e:
                    c.create_job(name, **UNALLOCATABLE)
                assert "spec.samples_per_epoch = 68719476736" in e.value.message
                assert f"needs an estimated {UNALLOCATABLE_ESTIMATE} bytes" in e.value.message
                assert "--max_memory_bytes = " in e.value.message
            # num_samples = 2^32 (the default limit), M = N: 32 GiB of plans.
            if default_budget_upper_bound() < 2 * 4 * (1 << 32):
                with pytest.raises(samplerd.ResourceExhausted) as e:
                    c.create_job("all", num_samples=1 << 32, world_size=1)
                assert "spec.num_samples = 4294967296" in e.value.message
            check_nothing_left_behind(c, data_dir)
    finally:
        assert server.stop() == 0


def test_a_raised_sample_limit_is_still_bounded_by_memory(tmp_path):
    """N = 5e9 with --max_samples_per_job raised: 8-byte indices, 80 GB of plans, 90 GB in all."""
    if default_budget_upper_bound() >= 2 * 8 * 5_000_000_000:
        pytest.skip("this machine has room for two 40 GB plans")
    server = SamplerdProcess("--max_jobs=3", "--max_samples_per_job=10000000000")
    try:
        with samplerd.Client(server.address, timeout=20) as c:
            with pytest.raises(samplerd.ResourceExhausted) as e:
                c.create_job("huge", num_samples=5_000_000_000, world_size=1)
            assert "spec.num_samples = 5000000000" in e.value.message
            # 80 GB of plans, 10 GB for the shuffle's bucket side array beyond M = 2^24 (2 B per
            # position), and a bit per shard position.
            assert "needs an estimated 907" in e.value.message
            assert "plans 74.5 GiB" in e.value.message
            assert c.list_jobs() == []
    finally:
        assert server.stop() == 0


def test_an_allocation_failure_leaves_nothing_behind(tmp_path):
    """The budget lifted (as if the estimate were wrong): the allocation itself fails, under a
    3 GiB address-space limit, and must still free the name, the slot and the directory."""
    data_dir = str(tmp_path / "data")
    server = SamplerdProcess("--max_jobs=3", f"--data_dir={data_dir}",
                             f"--max_memory_bytes={1 << 62}",
                             preexec_fn=address_space_limit(3 << 30),
                             env=dict(os.environ, MALLOC_ARENA_MAX="2"))
    try:
        with samplerd.Client(server.address, timeout=20) as c:
            for name in ["big", "big", "big2"]:
                with pytest.raises(samplerd.ResourceExhausted) as e:
                    c.create_job(name, **UNALLOCATABLE)
                assert f"job '{name}': out of memory while creating it" in e.value.message
                assert "nothing was created" in e.value.message
            check_nothing_left_behind(c, data_dir)
    finally:
        assert server.stop() == 0


def test_uniform_draws_with_replacement_need_no_per_sample_memory():
    """N = 2e9, M = 1000: within a 3 GiB address space (8 B/sample would be 16 GB)."""
    n = 2_000_000_000
    server = SamplerdProcess(preexec_fn=address_space_limit(3 << 30),
                             env=dict(os.environ, MALLOC_ARENA_MAX="2"))
    try:
        with samplerd.Client(server.address, timeout=60) as c:
            c.create_job("u", num_samples=n, world_size=2, samples_per_epoch=1000,
                         replacement=True)
            for epoch in range(2):
                shards = [c.read_shard("u", epoch, rank, 2, observe=True) for rank in range(2)]
                assert [len(s) for s in shards] == [500, 500]
                assert all(0 <= i < n for s in shards for i in s)
                for rank in range(2):
                    c.end_epoch("u", epoch, rank)
    finally:
        assert server.stop() == 0
