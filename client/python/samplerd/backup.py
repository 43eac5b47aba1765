"""A consistent copy of a samplerd --data_dir, taken while the server runs (`samplerctl backup`).

Why it is consistent: samplerd's files survive a `kill -9` at any instant (docs/PERSISTENCE.md:
every acknowledged call is on disk, recovery loads all of it or refuses to start). So a copy of
the directory as it is at one instant, with the server's threads stopped (SIGSTOP; a write or
fsync in progress completes first), is what such a crash would leave, and a server started on
the copy recovers exactly the calls acknowledged before the freeze. A plain `cp -a` of a running
server is not: it reads the files at different instants (a log's head saying more bytes are
synced than the copy of its records holds, a snapshot already replaced by the next epoch's).

The freeze is kept short: snapshot files are never changed once written (a new one is written
beside and renamed over), so they are hard-linked, not copied, when the destination is on the
same file system; only the logs (the current epochs' records) are copied while the server is
stopped. Run it on the server's machine, as the server's user or root (it signals the process
holding DATA_DIR/LOCK). Without a running server it copies the directory as it is.
"""

import dataclasses
import os
import pathlib
import shutil
import signal
import time
from typing import Optional

LOCK_FILE = "LOCK"
JOBS_DIR = "jobs"


class BackupError(Exception):
    """The backup could not be taken; the message names the path and why."""


@dataclasses.dataclass
class BackupSummary:
    jobs: int
    files: int
    linked_bytes: int  # Snapshots hard-linked (no copy).
    copied_bytes: int
    server_pid: Optional[int]  # The server that was frozen, or None if none ran.
    frozen_ms: float  # How long its threads were stopped.


def lock_holder(data_dir: pathlib.Path) -> Optional[int]:
    """The pid of the process holding DATA_DIR/LOCK (samplerd's flock), from /proc/locks; None
    if no process holds it."""
    lock = data_dir / LOCK_FILE
    try:
        st = lock.stat()
    except FileNotFoundError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            # "1: FLOCK  ADVISORY  WRITE 12345 fe:00:1096 0 EOF"
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device:
                pid = int(fields[4])
                if pid <= 0:
                    raise BackupError(f"{lock}: held by a process of another pid namespace; "
                                      "run the backup where samplerd runs")
                return pid
    return None


def _all_threads_stopped(pid: int) -> bool:
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue  # A thread that ended meanwhile.
        if state not in ("T", "t"):
            return False
    return True


def _freeze(pid: int, timeout_s: float = 30) -> None:
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while not _all_threads_stopped(pid):  # A thread in a write or fsync finishes it first.
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGCONT)
            raise BackupError(f"samplerd (pid {pid}) did not stop within {timeout_s} s")
        time.sleep(0.001)


def _fsync_tree(root: pathlib.Path) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def backup_data_dir(data_dir, destination) -> BackupSummary:
    """Copies the live DATA_DIR to DESTINATION (which must not exist), made durable (fsync)
    before it returns. Raises BackupError naming the path when DATA_DIR is no samplerd data
    directory, DESTINATION exists, or the server cannot be frozen."""
    data_dir, destination = pathlib.Path(data_dir), pathlib.Path(destination)
    if not (data_dir / JOBS_DIR).is_dir():
        raise BackupError(f"{data_dir}: not a samplerd --data_dir (no {JOBS_DIR}/ directory)")
    if destination.exists():
        raise BackupError(f"{destination}: exists; give a new directory")
    destination.mkdir(parents=True)
    (destination / JOBS_DIR).mkdir()
    try:
        pid = lock_holder(data_dir)
    except PermissionError as e:
        raise BackupError(f"/proc/locks: {e.strerror}") from None
    summary = BackupSummary(jobs=0, files=0, linked_bytes=0, copied_bytes=0, server_pid=pid,
                            frozen_ms=0.0)
    start = time.monotonic()
    if pid is not None:
        try:
            _freeze(pid)
        except PermissionError:
            raise BackupError(f"cannot stop samplerd (pid {pid}, holding {data_dir / LOCK_FILE}): "
                              "run the backup as its user or root") from None
    try:
        for job in sorted((data_dir / JOBS_DIR).iterdir()):
            if not job.is_dir():
                continue
            (destination / JOBS_DIR / job.name).mkdir()
            summary.jobs += 1
            for source in sorted(job.iterdir()):
                if source.name.endswith(".tmp"):
                    continue  # A snapshot being written: recovery would remove it.
                target = destination / JOBS_DIR / job.name / source.name
                size = source.stat().st_size
                if source.name.startswith("snapshot-") and source.name.endswith(".bin"):
                    try:
                        os.link(source, target)
                        summary.linked_bytes += size
                        summary.files += 1
                        continue
                    except OSError:
                        pass  # Another file system: copied below.
                shutil.copy2(source, target)
                summary.copied_bytes += size
                summary.files += 1
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
            summary.frozen_ms = (time.monotonic() - start) * 1e3
    _fsync_tree(destination)
    return summary
