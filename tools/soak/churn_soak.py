#!/usr/bin/env python3
"""Churn soak of a real samplerd (issue 33, part 3): run by hand, bounded by --minutes, not in CI.

For the whole run it churns one samplerd (`--data_dir`, a fixed port found free) the way a busy
cluster does, and checks at the end what must hold (docs/HARDENING.md, "Churn soak"):

  jobs       --slots jobs alive at once; each is created, trained for EPOCHS epochs by its own
             trainer processes, checked, and deleted; some are deleted mid-run instead (their
             trainers must stop with NotFound);
  trainers   real OS processes using the Python client (samplerd.torch's sampler), forked from a
             multiprocessing forkserver that imported torch and samplerd once (no model: the loss
             is a fixed function of (epoch, index), so the 2-core machine is not saturated).
             Each checkpoints its sampler's state_dict() every CKPT_EVERY steps and at the end
             of its shard; each is SIGKILLed mid-epoch now and then and restarted from its
             checkpoint (the client README's restart loop);
  resizes    a job's group is torn down (every rank SIGKILLed, as torchrun does) and restarted
             with another world size (ranks leave or join; elastic=True, rank 0 resizes);
  rewinds    a job's group is torn down, the job rewound (RewindJob) to a kept epoch start, the
             group restarted without states;
  samplerd   SIGKILLed and started again on the same --data_dir and port every few minutes; the
             trainers ride through on the client's retries.

samplerd's RSS, open file descriptors and threads are sampled every --sample_every seconds into
`resources.csv` (the churned server and the reference, which is never killed), and judged flat
per server incarnation: the slope of a least-squares line over the last 2/3 of the incarnation's
samples, and the max against the first sample after that warm-up third.

At the end every job that finished is checked against an uninterrupted reference: the same job
(seed, spec; world size 1) trained on a second samplerd that is never killed, every shard read
and every loss reported once:
  - plans:    each epoch's plan as the soak's server dealt it (read with observe=True whenever
              the driver saw an epoch's first deal) equals the reference's;
  - trained:  each epoch's samples trained (every trainer logs each batch before reporting it)
              are exactly the reference plan: none skipped, none from outside; every repeat is
              explained by the client's documented rule -- a replay of what a killed process
              trained after its last checkpoint, the padding of a deal made after a resize, or
              a redealt state's unacknowledged losses (restart_summary) -- and a rewind's epochs
              count from the rewind on;
  - losses:   the weights (every WeightStats field, bit for bit) and samples_seen equal the
              reference's: every acknowledged loss kept, none counted twice.
It prints a summary (and writes summary.json) and exits 1 when an invariant fails.

  .venv/bin/python tools/soak/churn_soak.py --minutes 3            # a rehearsal
  nice -n 10 .venv/bin/python tools/soak/churn_soak.py --minutes 35 --server_kill_every 300 \
    --out /tmp/soak                                                 # bench/RESULTS.md's run
"""

import argparse
import collections
import json
import multiprocessing
import os
import pathlib
import random
import shutil
import signal
import socket
import sys
import threading
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLIENT = ROOT / "client" / "python"
sys.path.insert(0, str(CLIENT))
sys.path.insert(0, str(ROOT / "tests" / "python"))

# The jobs: M divisible by every world size used, so that whole-epoch deals have no padding.
N, M, EPOCHS = 2000, 600, 8
WORLDS = (2, 3, 4)
BATCH, CKPT_EVERY = 10, 2
JOB_ARGS = dict(num_samples=N, samples_per_epoch=M, loss="loss", ema_decay=0.5, alpha=1.0,
                mix=0.1)


def loss_of(epoch, index):
    """The loss every trainer reports for sample `index` in `epoch`: whoever trains it."""
    return ((index * 37 + epoch * 11) % 101) / 50.0


# -- the trainer (runs in a process forked from the forkserver) ---------------------------------

def _append(fd, record):
    """One line in one write(2) on an O_APPEND descriptor: lines of several processes never
    interleave, and a SIGKILL right after keeps it (the page cache has it)."""
    os.write(fd, (json.dumps(record) + "\n").encode())


def trainer(cfg):
    """One rank: the client README's restart loop, without a model."""
    log = open(cfg["log"], "a")
    os.dup2(log.fileno(), 2)
    sys.stderr = log
    import pickle
    import warnings
    import samplerd
    from samplerd.torch import DistributedWeightedSampler
    if not samplerd.__file__.startswith(str(CLIENT)):  # Not an installed copy: the tree's.
        print(f"trainer: samplerd imported from {samplerd.__file__}, not {CLIENT}", file=log,
              flush=True)
        os._exit(2)
    warnings.simplefilter("always", samplerd.RestartWarning)
    fd = os.open(cfg["records"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    rank, job = cfg["rank"], cfg["job"]
    tag = {"pid": os.getpid(), "rank": rank}
    path = os.path.join(cfg["dir"], f"ckpt-rank{rank}.pkl")
    try:
        sampler = DistributedWeightedSampler(cfg["address"], job, rank=rank,
                                             world_size=cfg["world"], report_batch_size=BATCH,
                                             elastic=True)
        _append(fd, {**tag, "kind": "start", "world": cfg["world"]})
        if os.path.exists(path):
            with open(path, "rb") as f:
                state = pickle.load(f)
            sampler.load_state_dict(state)
            _append(fd, {**tag, "kind": "load", "epoch": state["epoch"],
                         "position": state["position"], "summary": dict(sampler.restart_summary)})
        steps = 0

        def checkpoint(epoch):
            with open(path + ".tmp", "wb") as f:
                pickle.dump(sampler.state_dict(), f)
            os.replace(path + ".tmp", path)  # A kill never leaves half a file.
            _append(fd, {**tag, "kind": "ckpt", "epoch": epoch})

        for epoch in range(sampler.epoch, cfg["epochs"]):
            sampler.set_epoch(epoch)
            batch = []
            for i in sampler:
                batch.append(int(i))
                if len(batch) < BATCH:
                    continue
                _append(fd, {**tag, "kind": "train", "epoch": epoch, "indices": batch})
                sampler.report(batch, [loss_of(epoch, b) for b in batch])
                batch = []
                steps += 1
                if steps % CKPT_EVERY == 0:
                    checkpoint(epoch)
                time.sleep(cfg["step_seconds"])
            if batch:
                _append(fd, {**tag, "kind": "train", "epoch": epoch, "indices": batch})
                sampler.report(batch, [loss_of(epoch, b) for b in batch])
            checkpoint(epoch)  # The end of the epoch's shard.
        sampler.close()
        _append(fd, {**tag, "kind": "done", "summary": dict(sampler.restart_summary)})
    except samplerd.NotFound as e:
        print(f"trainer {job} rank {rank}: NotFound: {e}", file=log, flush=True)
        os._exit(3)
    except BaseException:
        traceback.print_exc(file=log)
        log.flush()
        os._exit(1)
    log.flush()
    os._exit(0)


# -- the driver ---------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A samplerd on a fixed port (so that a restart keeps the clients' address); `kill_and_restart`
    is a crash and a supervisor's restart."""

    def __init__(self, name, out, data_dir=None):
        from conftest import SamplerdProcess
        self.name, self.port, self.incarnation = name, free_port(), 0
        self.data_dir, self.restart_seconds = data_dir, []
        self._err = open(os.path.join(out, f"{name}.stderr"), "a")
        args = [f"--port={self.port}"] + ([f"--data_dir={data_dir}"] if data_dir else [])
        self._make = lambda: SamplerdProcess(*args, stderr=self._err)
        self.process = self._make()
        self.address = self.process.address
        self.lock = threading.Lock()

    @property
    def pid(self):
        return self.process.proc.pid

    def kill_and_restart(self):
        with self.lock:
            code = self.process.kill()
            assert code == -signal.SIGKILL, code
            self.process.proc.stdout.close()
            time.sleep(0.5)
            started = time.monotonic()
            self.process = self._make()
            self.restart_seconds.append(time.monotonic() - started)
            assert self.process.address == self.address, (self.process.address, self.address)
            self.incarnation += 1

    def stop(self):
        code = self.process.stop()
        self.process.proc.stdout.close()
        return code


def dir_kib(path):
    """Bytes of the files under `path`, KiB (files vanish while it walks: a live server)."""
    total = 0
    for parent, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(parent, name))
            except OSError:
                pass
    return total // 1024


def proc_sample(pid):
    """(rss KiB, open fds, threads) of a live process, from /proc."""
    rss = threads = None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


class Monitor(threading.Thread):
    """Samples each server every `every` seconds into resources.csv."""

    def __init__(self, servers, path, every, soak):
        super().__init__(daemon=True)
        self.servers, self.every, self.soak = servers, every, soak
        self.rows, self.stop, self.t0 = [], threading.Event(), time.monotonic()
        self.file = open(path, "w")
        self.file.write("elapsed_s,server,incarnation,pid,rss_kib,fds,threads,jobs,trainers,"
                        "data_dir_kib\n")

    def run(self):
        while not self.stop.is_set():
            for s in self.servers:
                with s.lock:
                    inc, pid = s.incarnation, s.pid
                    try:
                        rss, fds, threads = proc_sample(pid)
                    except (OSError, ValueError):
                        continue
                row = (round(time.monotonic() - self.t0, 1), s.name, inc, pid, rss, fds, threads,
                       self.soak.jobs_alive(), self.soak.trainers_alive(),
                       dir_kib(s.data_dir) if s.data_dir else "")
                self.rows.append(row)
                self.file.write(",".join(map(str, row)) + "\n")
                self.file.flush()
            self.stop.wait(self.every)


def slope_per_minute(points):
    """Least-squares slope of [(t seconds, y)], per minute."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if var == 0 else 60 * sum((t - mt) * (y - my) for t, y in points) / var


# Flat: over the last 2/3 of an incarnation the fitted line rises by at most this much, and the
# max exceeds the first sample after warm-up by at most this much (fds and threads follow the
# number of connected trainers and open streams, which come and go).
FLAT = {"rss_kib": (8 * 1024, 0.10), "fds": (12, 0.0), "threads": (12, 0.0)}  # (abs, relative)
COLUMNS = {"rss_kib": 4, "fds": 5, "threads": 6}


def judge_resources(rows, min_samples=6):
    """Per (server, incarnation): first, first after warm-up, max, last, the fitted slope and
    whether each measure is flat."""
    by = collections.defaultdict(list)
    for row in rows:
        by[(row[1], row[2])].append(row)
    verdicts = []
    for (server, inc), rs in sorted(by.items()):
        entry = {"server": server, "incarnation": inc, "samples": len(rs),
                 "minutes": round((rs[-1][0] - rs[0][0]) / 60, 1)}
        warm = rs[len(rs) // 3:]
        for name, col in COLUMNS.items():
            ys = [r[col] for r in warm]
            slope = slope_per_minute([(r[0], r[col]) for r in warm])
            span = (warm[-1][0] - warm[0][0]) / 60
            limit_abs, limit_rel = FLAT[name]
            limit = max(limit_abs, limit_rel * ys[0])
            m = {"first": rs[0][col], "after_warmup": ys[0], "max": max(ys), "last": ys[-1],
                 "slope_per_min": round(slope, 2), "fitted_rise": round(slope * span, 1)}
            if len(rs) >= min_samples:
                m["flat"] = slope * span <= limit and max(ys) - ys[0] <= limit
            entry[name] = m
        verdicts.append(entry)
    return verdicts


class JobRun:
    """One job of the soak: its trainer processes, records and what the driver observed."""

    def __init__(self, soak, k):
        self.name = f"soak-{soak.seed}-{k:04d}"
        self.seed = soak.seed * 1000 + k
        self.world = soak.rng.choice(WORLDS[:2])
        self.dir = os.path.join(soak.out, "jobs", self.name)
        os.makedirs(self.dir)
        self.records = os.path.join(self.dir, "records.jsonl")
        self.procs = {}            # rank -> multiprocessing.Process
        self.done = set()          # ranks that exited 0
        self.state = "running"     # running, finished, deleted, failed
        self.observed = collections.defaultdict(list)  # epoch -> [sorted plan as dealt]
        self.errors = 0
        self.last_size, self.last_progress = 0, time.monotonic()

    def note(self, record):
        fd = os.open(self.records, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            _append(fd, {"pid": 0, "rank": -1, **record})
        finally:
            os.close(fd)


class Soak:
    def __init__(self, args):
        self.args, self.seed, self.out = args, args.seed, args.out
        self.rng = random.Random(args.seed)
        self.jobs, self.counts, self.live_trainers = [], collections.Counter(), 0
        self.failures = []         # (job or "", what)
        # The forkserver imports its preloads with the environment's path, not this sys.path:
        # the working tree's client, not a copy installed in the venv.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(CLIENT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(["__main__", "samplerd.torch"])
        self.server = Server("churned", self.out, data_dir=os.path.join(self.out, "data"))
        self.reference = Server("reference", self.out)
        import samplerd
        self.samplerd = samplerd
        self.client = samplerd.Client(self.server.address, timeout=30)
        self.ref_client = samplerd.Client(self.reference.address, timeout=30)

    def jobs_alive(self):
        return sum(1 for j in self.jobs if j.state == "running")

    def trainers_alive(self):
        return self.live_trainers  # Counted by the loop (Process is not for other threads).

    def fail(self, job, what):
        self.failures.append((job.name if job else "", what))
        print(f"FAIL {job.name if job else ''}: {what}", flush=True)

    # -- trainers --

    def start_rank(self, job, rank):
        cfg = {"address": self.server.address, "job": job.name, "rank": rank,
               "world": job.world, "epochs": EPOCHS, "dir": job.dir, "records": job.records,
               "log": os.path.join(job.dir, "trainers.log"),
               "step_seconds": self.args.step_seconds}
        p = self.ctx.Process(target=trainer, args=(cfg,), daemon=True)
        p.start()
        job.procs[rank] = p
        self.counts["trainer_starts"] += 1

    def start_group(self, job):
        job.procs, job.done = {}, set()
        for rank in range(job.world):
            self.start_rank(job, rank)

    def kill(self, job, rank):
        p = job.procs[rank]
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        if p.exitcode == -signal.SIGKILL:
            job.note({"kind": "killed", "victim": p.pid})
            return True
        if p.exitcode == 0:
            job.done.add(rank)
        else:  # It had exited on its own, with an error.
            self.counts["trainer_errors"] += 1
            self.fail(job, f"rank {rank} (pid {p.pid}) exited {p.exitcode} on its own; "
                           f"see {job.dir}/trainers.log")
        return False

    def teardown(self, job):
        """Every rank of the group SIGKILLed (torchrun tearing the group down)."""
        for rank in list(job.procs):
            if rank not in job.done:
                self.kill(job, rank)

    # -- events --

    def new_job(self, k):
        job = JobRun(self, k)
        self.client.create_job(job.name, world_size=job.world, seed=job.seed, resume=True,
                               **JOB_ARGS)
        self.jobs.append(job)
        self.counts["jobs_created"] += 1
        self.start_group(job)

    def running(self, *, whole=True):
        """Running jobs; `whole`: none of whose ranks has finished (a group to tear down)."""
        return [j for j in self.jobs if j.state == "running" and not (whole and j.done)]

    def kill_trainer(self):
        jobs = self.running(whole=False)
        if not jobs:
            return
        job = self.rng.choice(jobs)
        live = [r for r, p in job.procs.items() if p.is_alive()]
        if not live:
            return
        rank = self.rng.choice(live)
        if self.kill(job, rank):
            self.counts["trainer_kills"] += 1
            self.start_rank(job, rank)  # The replacement, at once.

    def resize(self):
        jobs = self.running()
        if not jobs:
            return
        job = self.rng.choice(jobs)
        self.teardown(job)
        if job.done:  # A rank finished meanwhile: the last epoch; let the others finish it.
            for rank in range(job.world):
                if rank not in job.done:
                    self.start_rank(job, rank)
            return
        old = job.world
        job.world = self.rng.choice([w for w in WORLDS if w != old])
        for rank in range(job.world, old):  # The checkpoints of ranks the group no longer has.
            path = os.path.join(job.dir, f"ckpt-rank{rank}.pkl")
            if os.path.exists(path):
                os.remove(path)
        job.note({"kind": "resize", "world": job.world})
        self.counts["resizes"] += 1
        self.counts["ranks_joined"] += max(job.world - old, 0)
        self.counts["ranks_left"] += max(old - job.world, 0)
        self.start_group(job)

    def rewind(self):
        jobs = [j for j in self.running() if self.client.get_job(j.name).current_epoch >= 1]
        if not jobs:
            return
        job = self.rng.choice(jobs)
        self.teardown(job)
        if job.done:
            for rank in range(job.world):
                if rank not in job.done:
                    self.start_rank(job, rank)
            return
        kept = list(self.client.get_job(job.name).rewindable_epochs)
        epoch = self.rng.choice(kept)
        self.client.rewind_job(job.name, epoch)
        for rank in range(max(WORLDS)):  # States past the rewound epoch's start are refused.
            path = os.path.join(job.dir, f"ckpt-rank{rank}.pkl")
            if os.path.exists(path):
                os.remove(path)
        job.note({"kind": "rewind", "epoch": epoch})
        for e in range(epoch, EPOCHS):
            job.observed.pop(e, None)  # Observed again: planned as the first time.
        self.counts["rewinds"] += 1
        world = self.client.get_job(job.name).world_size
        if world != job.world:
            job.note({"kind": "resize", "world": job.world})
        self.start_group(job)

    def delete_mid_run(self):
        jobs = self.running()
        if len(jobs) < 2:
            return
        job = self.rng.choice(jobs)
        self.client.delete_job(job.name)
        job.state = "deleted"
        self.counts["jobs_deleted_mid_run"] += 1
        deadline = time.monotonic() + 60
        for rank, p in job.procs.items():
            p.join(max(deadline - time.monotonic(), 0.1))
            if p.exitcode is None:
                self.fail(job, f"rank {rank} (pid {p.pid}) still running 60 s after its job "
                               "was deleted")
                self.kill(job, rank)
            elif p.exitcode not in (0, 3):
                self.fail(job, f"rank {rank} exited {p.exitcode} after its job was deleted "
                               f"(expected 3: NotFound); see {job.dir}/trainers.log")
        try:
            self.client.get_job(job.name)
            self.fail(job, "get_job of a deleted job did not raise NotFound")
        except self.samplerd.NotFound:
            pass

    def kill_server(self):
        self.server.kill_and_restart()
        self.counts["server_kills"] += 1
        print(f"[{self.elapsed():6.0f} s] samplerd SIGKILLed and restarted "
              f"(incarnation {self.server.incarnation})", flush=True)

    # -- the loop --

    def elapsed(self):
        return time.monotonic() - self.t0

    def reap(self):
        for job in self.running(whole=False):
            for rank, p in list(job.procs.items()):
                if p.is_alive() or rank in job.done:
                    continue
                if p.exitcode == 0:
                    job.done.add(rank)
                else:
                    job.errors += 1
                    self.counts["trainer_errors"] += 1
                    self.fail(job, f"rank {rank} (pid {p.pid}) exited {p.exitcode} on its own; "
                                   f"see {job.dir}/trainers.log")
                    if job.errors > 3:
                        job.state = "failed"
                        self.teardown(job)
                    else:
                        self.start_rank(job, rank)
            if job.state == "running" and len(job.done) == job.world:
                job.state = "finished"
                try:
                    self.verify(job)
                except self.samplerd.SamplerError as e:
                    self.fail(job, f"checking it raised {e!r}")
            elif job.state == "running":
                size = os.path.getsize(job.records) if os.path.exists(job.records) else 0
                if size != job.last_size:
                    job.last_size, job.last_progress = size, time.monotonic()
                elif time.monotonic() - job.last_progress > self.args.stall_seconds:
                    self.fail(job, f"no progress for {self.args.stall_seconds} s: "
                                   f"{self.client.status(job.name)}")
                    job.state = "failed"
                    self.teardown(job)

    def observe(self):
        """Reads the plan of one running job's current epoch as the server deals it (its first
        deal: every rank's shard, observe=True)."""
        jobs = self.running(whole=False)
        if not jobs:
            return
        job = self.rng.choice(jobs)
        try:
            info = self.client.get_job(job.name)
            epoch = info.current_epoch
            if not info.plan_ready or info.deal != 0 or epoch >= EPOCHS or epoch in job.observed:
                return
            plan = []
            for r in range(info.world_size):
                plan.extend(int(i) for i in self.client.read_shard(
                    job.name, epoch, r, info.world_size, observe=True, timeout=10))
            job.observed[epoch].append(sorted(plan))
            self.counts["plans_observed"] += 1
        except self.samplerd.SamplerError:
            pass  # Resized, rewound or moved on meanwhile: another time.

    def run(self):
        a = self.args
        self.t0 = time.monotonic()
        self.monitor = Monitor([self.server, self.reference],
                               os.path.join(self.out, "resources.csv"), a.sample_every, self)
        self.monitor.start()
        every = {"trainer_kill": a.trainer_kill_every, "resize": a.resize_every,
                 "rewind": a.rewind_every, "delete": a.delete_every,
                 "server_kill": a.server_kill_every}
        action = {"trainer_kill": self.kill_trainer, "resize": self.resize,
                  "rewind": self.rewind, "delete": self.delete_mid_run,
                  "server_kill": self.kill_server}
        due = {k: v * self.rng.uniform(0.5, 1.5) for k, v in every.items()}
        end, k, last_print = a.minutes * 60, 0, 0
        while True:
            now = self.elapsed()
            self.reap()
            if now < end:
                while self.jobs_alive() < a.slots:
                    k += 1
                    self.new_job(k)
                for kind in every:
                    if now >= due[kind]:
                        try:
                            action[kind]()
                        except self.samplerd.SamplerError as e:
                            self.fail(None, f"{kind}: {e!r}")
                        due[kind] = now + every[kind] * self.rng.uniform(0.5, 1.5)
                self.observe()
            elif not self.running(whole=False):
                break
            elif now > end + a.drain_seconds:
                for job in self.running(whole=False):
                    self.fail(job, f"not finished {a.drain_seconds} s after the churn stopped")
                    job.state = "failed"
                    self.teardown(job)
                break
            if now - last_print >= 60:
                last_print = now
                print(f"[{now:6.0f} s] jobs alive {self.jobs_alive()}, "
                      f"{dict(sorted(self.counts.items()))}", flush=True)
            self.live_trainers = sum(1 for j in self.jobs for p in j.procs.values()
                                     if p.exitcode is None)
            time.sleep(0.5)
        self.monitor.stop.set()
        self.monitor.join(30)
        for name, client in (("churned", self.client), ("reference", self.ref_client)):
            left = [j.name for j in client.list_jobs()]
            if left:
                self.fail(None, f"jobs left on the {name} samplerd after every job was deleted: "
                                f"{left}")

    # -- the invariants --

    def reference_of(self, job):
        """The uninterrupted training of the job on the reference server: per epoch the plan
        (sorted), and the status once the last epoch's losses made the weights."""
        ref = "ref-" + job.name
        c = self.ref_client
        c.create_job(ref, world_size=1, seed=job.seed, **JOB_ARGS)
        plans = []
        for epoch in range(EPOCHS):
            shard = c.read_shard(ref, epoch, 0, 1, timeout=60)
            c.report_losses(ref, epoch, 0, shard,
                            [loss_of(epoch, int(i)) for i in shard],
                            positions=list(range(len(shard))))
            c.end_epoch(ref, epoch, 0)
            plans.append(sorted(int(i) for i in shard))
        status = served_status(c, ref)
        c.delete_job(ref)
        return plans, status

    def verify(self, job):
        """Every invariant of a finished job (see the module doc); then the job is deleted."""
        problems = []
        status = served_status(self.client, job.name)
        plans, ref = self.reference_of(job)
        if status.job.current_epoch != EPOCHS:
            problems.append(f"current_epoch {status.job.current_epoch} != {EPOCHS}")
        for epoch, seen in sorted(job.observed.items()):
            for plan in seen:
                if plan != plans[epoch]:
                    problems.append(f"epoch {epoch}: the plan as dealt differs from the "
                                    "reference's")
        trained, tails, allowance, loads = trained_per_epoch(job.records)
        for r in loads:
            self.counts["states_loaded"] += 1
            self.counts["states_redealt"] += r["summary"].get("redealt_states", 0)
        replays = unexplained_total = 0
        for epoch in range(EPOCHS):
            if sorted(trained[epoch]) != plans[epoch]:
                missing = set(plans[epoch]) - set(trained[epoch])
                extra = set(trained[epoch]) - set(plans[epoch])
                problems.append(f"epoch {epoch}: trained != reference plan ({len(missing)} "
                                f"never trained, {len(extra)} not in the plan)")
            unexplained = 0
            for index, count in trained[epoch].items():
                replays += min(count - 1, tails[epoch][index])
                unexplained += max(count - 1 - tails[epoch][index], 0)
            unexplained_total += unexplained
            if unexplained > allowance[epoch]:
                problems.append(f"epoch {epoch}: {unexplained} repeats not explained by a "
                                f"replay, padding or a redealt state (allowed {allowance[epoch]})")
        if status.samples_seen != ref.samples_seen:
            problems.append(f"samples_seen {status.samples_seen} != reference "
                            f"{ref.samples_seen}")
        if status.weights != ref.weights:
            problems.append(f"weights {fmt(status.weights)} != reference {fmt(ref.weights)}")
        self.counts["positions_replayed"] += replays
        self.counts["repeats_by_padding_or_redeal"] += unexplained_total
        for p in problems:
            self.fail(job, p)
        self.counts["jobs_verified_ok" if not problems else "jobs_verified_failed"] += 1
        self.client.delete_job(job.name)
        self.counts["jobs_deleted_finished"] += 1
        if not problems and not self.args.keep_jobs:
            shutil.rmtree(job.dir)  # A failed job's records stay for a look.


def fmt(w):
    return (f"(min {w.min!r}, max {w.max!r}, mean {w.mean!r}, ess {w.effective_sample_size!r}, "
            f"zero {w.zero_count})")


def served_status(client, job):
    """The job's status once its current epoch is planned (the weights the last losses made)."""
    deadline = time.monotonic() + 60
    while not client.get_job(job).plan_ready and time.monotonic() < deadline:
        time.sleep(0.05)
    return client.status(job)


def trained_per_epoch(path):
    """From a job's records: {epoch: Counter of samples trained}, {epoch: Counter of trainings a
    restart may replay}, {epoch: repeats allowed by resized deals}. A replay: what a killed
    process trained after its last checkpoint. A rewind to epoch k drops what epochs >= k had.
    A resize lands in the epoch trained next: its deal pads at most world - 1 positions; a
    redealt state's unacknowledged losses (restart_summary) may be trained again."""
    trained, tails = collections.defaultdict(collections.Counter), \
        collections.defaultdict(collections.Counter)
    allowance = collections.Counter()
    pending = collections.defaultdict(list)   # pid -> trainings since its last checkpoint
    resize, loads = None, []
    with open(path) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        kind = r["kind"]
        if kind == "train":
            trained[r["epoch"]].update(r["indices"])
            pending[r["pid"]].append(r)
            if resize is not None:
                allowance[r["epoch"]] += resize - 1
                resize = None
        elif kind == "ckpt":
            pending[r["pid"]] = []
        elif kind == "killed":
            for t in pending.pop(r["victim"], []):
                tails[t["epoch"]].update(t["indices"])
        elif kind == "resize":
            resize = r["world"]
        elif kind == "load":
            loads.append(r)
            allowance[r["epoch"]] += r["summary"].get("redealt_unacknowledged", 0)
        elif kind == "rewind":
            for e in list(trained):
                if e >= r["epoch"]:
                    trained[e].clear()
                    tails[e].clear()
                    allowance[e] = 0
            pending.clear()
    return trained, tails, allowance, loads


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, required=True, help="how long the churn runs")
    p.add_argument("--out", default=None, help="output directory (default /tmp/samplerd-soak-*)")
    p.add_argument("--seed", type=int, default=33)
    p.add_argument("--slots", type=int, default=3, help="jobs alive at once")
    p.add_argument("--step_seconds", type=float, default=0.15, help="a trainer's pause per batch")
    # Each event's mean interval, seconds (each drawn uniformly in [0.5, 1.5] times it).
    p.add_argument("--trainer_kill_every", type=float, default=5.0)
    p.add_argument("--resize_every", type=float, default=30.0)
    p.add_argument("--rewind_every", type=float, default=45.0)
    p.add_argument("--delete_every", type=float, default=90.0)
    p.add_argument("--server_kill_every", type=float, default=180.0)
    p.add_argument("--sample_every", type=float, default=10.0)
    p.add_argument("--stall_seconds", type=float, default=240.0)
    p.add_argument("--drain_seconds", type=float, default=600.0)
    p.add_argument("--keep_jobs", action="store_true", help="keep every job's records")
    args = p.parse_args()
    args.out = args.out or f"/tmp/samplerd-soak-{time.strftime('%Y%m%dT%H%M%S')}"
    os.makedirs(args.out, exist_ok=True)
    print(f"soak: {args.minutes} min, seed {args.seed}, output in {args.out}", flush=True)
    soak = Soak(args)
    try:
        soak.run()
    except BaseException:
        traceback.print_exc()
        soak.fail(None, "the driver raised (above)")
    finally:
        for job in soak.jobs:
            for p_ in job.procs.values():
                if p_.is_alive():
                    p_.kill()
        codes = {"churned": soak.server.stop(), "reference": soak.reference.stop()}
    for name, code in codes.items():
        if code != 0:
            soak.fail(None, f"{name} samplerd exited {code} on SIGTERM")
    left = os.listdir(os.path.join(soak.server.data_dir, "jobs"))
    if left:
        soak.fail(None, f"--data_dir still holds jobs after every job was deleted: {left}")
    disk = [r[9] for r in soak.monitor.rows if r[1] == "churned"]
    resources = judge_resources(soak.monitor.rows)
    for entry in resources:
        for name in COLUMNS:
            if entry[name].get("flat") is False:
                soak.fail(None, f"{entry['server']} incarnation {entry['incarnation']}: "
                                f"{name} not flat: {entry[name]}")
    summary = {"minutes": round(soak.elapsed() / 60, 1), "seed": args.seed,
               "counts": dict(sorted(soak.counts.items())), "resources": resources,
               "data_dir_kib": {"first": disk[0], "max": max(disk), "last": disk[-1]}
               if disk else None,
               "failures": soak.failures}
    restarts = soak.server.restart_seconds
    summary["samplerd_restart_seconds"] = {"max": round(max(restarts), 2),
                                           "mean": round(sum(restarts) / len(restarts), 2)} \
        if restarts else None
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: summary[k] for k in ("minutes", "counts", "data_dir_kib",
                                              "samplerd_restart_seconds")}, indent=1))
    for e in resources:
        print(f"{e['server']:9s} inc {e['incarnation']:2d} {e['minutes']:5.1f} min "
              f"{e['samples']:3d} samples | " + " | ".join(
                  f"{n} {e[n]['first']}->{e[n]['after_warmup']}..max {e[n]['max']}->"
                  f"{e[n]['last']} slope {e[n]['slope_per_min']}/min "
                  f"{'flat' if e[n].get('flat') else ('NOT FLAT' if 'flat' in e[n] else '-')}"
                  for n in COLUMNS))
    print(f"{len(soak.failures)} failure(s)" if soak.failures else "every invariant held")
    sys.exit(1 if soak.failures else 0)


if __name__ == "__main__":
    main()
