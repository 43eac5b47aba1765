"""Memory through the real samplerd binary: admission by memory, and what a job does not need.

Issue 22: the stream buffers and the transport buffers are taken from --max_memory_bytes before
any job (server/memory_budget.h); a job used to be admitted whose estimate fitted the budget
although the stream buffers, outside it, did not fit beside it.

Issue 9, defect 1: a CreateJob that could not be allocated threw out of the server (UNKNOWN),
leaking its name, a --max_jobs slot and an empty job directory. Defect 4: a UNIFORM job with
replacement held 8 bytes per sample although uniform draws need no per-sample state.
"""

import os
import resource

import pytest

import samplerd
from conftest import SamplerdProcess, run_samplerd_expecting_failure

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


MIB = 1 << 20


def test_the_stream_and_transport_buffers_are_taken_from_the_budget_before_any_job():
    """--max_memory_bytes = 256 MiB, stream buffers 128 MiB, transport buffers 64 MiB (the
    default quarter): the jobs have 64 MiB. A 101.6 MiB job (two 50 MiB plans and a bit per
    position) fits the whole budget but not beside the buffers: it was admitted, and with full
    stream buffers the server held 229.6 MiB of the 256 MiB for a job that had 64 MiB."""
    m = 100 * MIB // 8  # Two plans of 4-byte indices: 100 MiB.
    server = SamplerdProcess(f"--max_memory_bytes={256 * MIB}",
                             f"--max_stream_buffer_bytes={128 * MIB}", "--backend=cpu")
    try:
        with samplerd.Client(server.address, timeout=20) as c:
            with pytest.raises(samplerd.ResourceExhausted) as e:
                c.create_job("big", num_samples=1000, world_size=1, samples_per_epoch=m,
                             replacement=True)
            assert f"spec.samples_per_epoch = {m}" in e.value.message
            assert f"left of the jobs' budget, --max_memory_bytes = {256 * MIB} bytes" \
                in e.value.message
            assert f"less the serving reserve of {192 * MIB} bytes" in e.value.message
            assert c.list_jobs() == []
            # What the jobs have is theirs: a 57 MiB job fits.
            c.create_job("fits", num_samples=1000, world_size=1,
                         samples_per_epoch=56 * MIB // 8, replacement=True)
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("args, reserve", [
    ([f"--max_stream_buffer_bytes={1 << 30}"], "plus --max_transport_buffer_bytes = 268435456"),
    ([f"--max_stream_buffer_bytes={512 * MIB}", f"--max_transport_buffer_bytes={512 * MIB}"],
     "plus --max_transport_buffer_bytes = 536870912"),
])
def test_a_serving_reserve_that_leaves_the_jobs_nothing_stops_the_server_at_start(args, reserve):
    rc, stderr = run_samplerd_expecting_failure(f"--max_memory_bytes={1 << 30}", *args,
                                                "--backend=cpu")
    assert rc != 0
    assert "--max_stream_buffer_bytes = " in stderr, stderr
    assert reserve in stderr, stderr
    assert "leaves nothing of --max_memory_bytes = 1073741824 bytes" in stderr, stderr


def test_the_defaults_of_a_2_gib_container_leave_the_jobs_0_8_gib():
    """--max_memory_bytes as samplerd sizes itself under a 2 GiB cgroup limit (80%): it starts
    with the default stream and transport buffers (a quarter each, 410 MiB), a 1 GiB job is
    refused before anything is allocated, and a job serves its epochs."""
    budget = (2 << 30) // 5 * 4
    server = SamplerdProcess(f"--max_memory_bytes={budget}", "--backend=cpu")
    try:
        with samplerd.Client(server.address, timeout=20) as c:
            with pytest.raises(samplerd.ResourceExhausted) as e:
                c.create_job("gib", num_samples=1000, world_size=1,
                             samples_per_epoch=(1 << 30) // 8, replacement=True)
            assert f"less the serving reserve of {2 * (budget // 4)} bytes" in e.value.message
            c.create_job("small", num_samples=100_000, world_size=2, loss="loss")
            for epoch in range(2):
                shards = [c.read_shard("small", epoch, rank, 2) for rank in range(2)]
                assert sorted(i for s in shards for i in s) == list(range(100_000))
                for rank in range(2):
                    c.end_epoch("small", epoch, rank)
    finally:
        assert server.stop() == 0
