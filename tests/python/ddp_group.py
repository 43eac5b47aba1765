"""Runs a group of DDP rank processes for the DDP tests and tears it down, also when a rank
died and the others hang in a collective with a dead peer."""

import multiprocessing.connection
import socket
import time

import torch.multiprocessing as mp


def free_port():
    """A TCP port free on 127.0.0.1 now (the group's MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(worker, world, cfg, victim=None, timeout=180):
    """Starts `world` processes running worker(rank, cfg) (spawned: `worker` is a module-level
    function) and waits until all exited, or (with `victim`) until that rank did, or until
    `timeout` seconds passed; then kills whatever still runs -- ranks blocked in a collective
    with a dead peer -- and returns the exit codes seen before that teardown (None: still
    running)."""
    ctx = mp.get_context("spawn")
    # Not daemonic: a rank may start DataLoader worker processes.
    procs = [ctx.Process(target=worker, args=(r, cfg), name=f"rank{r}") for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = [p.exitcode for p in procs]  # waitpid: set once the rank itself exited.
            if all(c is not None for c in codes):
                break
            if victim is not None:
                # Survivors that fail first (gloo noticed the closed connection) change nothing.
                if codes[victim] is not None:
                    break
            elif any(c not in (None, 0) for c in codes):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # The sentinels of the processes `codes` saw running (not re-read: a list emptied by
            # exits since then would make wait() sleep its whole timeout). A sentinel fires once
            # every holder of the pipe exited, a rank's DataLoader workers included: at most 1 s
            # between looks at the exit codes.
            multiprocessing.connection.wait(
                [p.sentinel for p, c in zip(procs, codes) if c is None], timeout=min(left, 1.0))
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
        for p in procs:
            p.join(30)
    return codes
