"""A consistent copy of a samplerd --data_dir, taken while the server runs (`samplerctl backup`).

Why it is consistent: samplerd's files survive a `kill -9` at any instant (docs/PERSISTENCE.md:
every acknowledged call is on disk, recovery loads all of it or refuses to start). So a copy of
the directory as it is at one instant, with the server's threads stopped (SIGSTOP; a write or
fsync in progress completes first), is what such a crash would leave, and a server started on
the copy recovers every call acknowledged before the freeze (and possibly calls in flight at
that instant, whose answers came after it). A plain `cp -a` of a running server is not: it reads
the files at different instants (a log's head saying more bytes are synced than the copy of its
records holds, a snapshot already replaced by the next epoch's).

The freeze is kept short: snapshot files are never changed once written (a new one is written
beside and renamed over), so they are hard-linked, not copied, when the destination is on the
same file system; only the logs (the current epochs' records) are copied while the server is
stopped. Run it on the server's machine, as the server's user or root (it signals the process
holding DATA_DIR/LOCK).

The server is always resumed (SIGCONT): when the copy ends, fails or is interrupted (Ctrl-C,
SIGTERM, SIGHUP), and, if this process dies while the server is stopped (even by SIGKILL), by a
watchdog process that it forks before stopping the server. Without a running server the
directory is copied as it is, holding DATA_DIR/LOCK (shared) so that no samplerd can start on it
meanwhile. The copy is made in a hidden staging directory beside DEST and renamed to DEST only
once complete and synced: DEST never holds a partial copy.
"""

import contextlib
import dataclasses
import fcntl
import os
import pathlib
import shutil
import signal
import tempfile
import threading
import time
from typing import Optional

LOCK_FILE = "LOCK"
JOBS_DIR = "jobs"
STOP_TIMEOUT_S = 30  # How long the server's threads may take to stop (a slow fsync).


class BackupError(Exception):
    """The backup could not be taken: `path` and why (`reason`). DEST was not created."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclasses.dataclass
class BackupSummary:
    jobs: int
    files: int
    linked_bytes: int  # Snapshots hard-linked (no copy).
    copied_bytes: int
    server_pid: Optional[int]  # The server that was frozen, or None if none ran.
    frozen_ms: float  # How long its threads were stopped.


def lock_holder(data_dir: pathlib.Path) -> Optional[int]:
    """The pid of the process holding DATA_DIR/LOCK exclusively (samplerd's flock), from
    /proc/locks; None if none is listed there."""
    lock = data_dir / LOCK_FILE
    try:
        st = lock.stat()
    except FileNotFoundError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as locks:
            lines = locks.readlines()
    except OSError as e:
        raise BackupError("/proc/locks", e.strerror) from None
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 12345 fe:00:1096 0 EOF"
        if (len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == "WRITE"
                and fields[5] == device):
            pid = int(fields[4])
            if pid <= 0:
                raise BackupError(lock, "held by a process of another pid namespace; run the "
                                  "backup where samplerd runs")
            return pid
    return None


def _all_threads_stopped(pid: int) -> bool:
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # A thread that ended meanwhile.
        if state not in ("T", "t", "Z", "X"):  # Stopped, or ended.
            return False
    return True


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP raise KeyboardInterrupt while inside (as Ctrl-C does), so that the
    cleanup runs instead of the process ending on the spot. Python only lets the main thread
    set handlers; elsewhere the watchdog alone resumes the server."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _resumed_at_the_end(pid: int):
    """Sends SIGCONT to `pid` when the block ends, however it ends. A watchdog child process,
    forked on entry, waits for the end of a pipe whose write end only this process holds: when
    this process closes it, or dies (SIGKILL included, when no finally runs), the watchdog
    sends SIGCONT. It has its own session and ignores the terminal's signals, so a Ctrl-C or a
    hangup that ends this process does not end it."""
    read_end, write_end = os.pipe()
    ignored = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ignored)  # Until the child ignores them.
    watchdog = os.fork()
    if watchdog == 0:
        try:
            os.setsid()
            for s in ignored:
                signal.signal(s, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            os.close(write_end)
            while os.read(read_end, 1):
                pass
            os.kill(pid, signal.SIGCONT)
        finally:
            os._exit(0)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    os.close(read_end)
    try:
        yield
    finally:
        os.close(write_end)  # First: from here on the watchdog resumes the server whatever comes.
        try:
            os.kill(pid, signal.SIGCONT)  # And at once, before this returns.
        except ProcessLookupError:
            pass
        os.waitpid(watchdog, 0)


@dataclasses.dataclass
class _Quiet:
    server_pid: Optional[int]
    frozen_ms: float = 0.0


@contextlib.contextmanager
def _no_writes(data_dir: pathlib.Path):
    """Inside, nothing writes DATA_DIR: either no samplerd runs, and none can start (this
    process holds DATA_DIR/LOCK shared; samplerd takes it exclusively), or the one holding it
    is stopped (SIGSTOP) until the block ends."""
    lock = data_dir / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None  # No samplerd ever ran here (it makes the file before touching the jobs).
    except OSError as e:
        raise BackupError(lock, e.strerror) from None
    try:
        pid = None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = lock_holder(data_dir)
                if pid is None:
                    raise BackupError(lock, "locked by a process not found in /proc/locks (a "
                                      "container's view of the file?); run the backup where "
                                      "samplerd runs, or stop it first") from None
        if pid is None:
            yield _Quiet(None)
            return
        quiet = _Quiet(pid)
        with _signals_interrupt(), _resumed_at_the_end(pid):
            start = time.monotonic()
            try:
                os.kill(pid, signal.SIGSTOP)
            except PermissionError:
                raise BackupError(lock, f"held by samplerd (pid {pid}), which this user may not "
                                  "stop: run the backup as its user or root") from None
            deadline = start + STOP_TIMEOUT_S
            while not _all_threads_stopped(pid):  # A thread in a write or fsync finishes it.
                if time.monotonic() > deadline:
                    raise BackupError(lock, f"samplerd (pid {pid}) did not stop within "
                                      f"{STOP_TIMEOUT_S} s; resumed, nothing copied")
                time.sleep(0.001)
            try:
                yield quiet
            finally:
                quiet.frozen_ms = (time.monotonic() - start) * 1e3
    finally:
        if fd is not None:
            os.close(fd)


def _copy_jobs(data_dir: pathlib.Path, staging: pathlib.Path, summary: BackupSummary) -> None:
    for job in sorted((data_dir / JOBS_DIR).iterdir()):
        if not job.is_dir():
            continue
        (staging / JOBS_DIR / job.name).mkdir()
        summary.jobs += 1
        for source in sorted(job.iterdir()):
            if source.name.endswith(".tmp"):
                continue  # A snapshot being written: recovery would remove it.
            target = staging / JOBS_DIR / job.name / source.name
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


def _fsync(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: pathlib.Path) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            _fsync(os.path.join(directory, name))
        _fsync(directory)


def backup_data_dir(data_dir, destination) -> BackupSummary:
    """Copies the live DATA_DIR to DESTINATION (which must not exist; its parent is created if
    needed), made durable (fsync, the parent directory included) before it returns. Raises
    BackupError naming the path when DATA_DIR is no samplerd data directory, DESTINATION
    exists, the server cannot be stopped, or a file cannot be read or written; DESTINATION is
    then not created. The server is resumed in every case (see the module comment)."""
    data_dir, destination = pathlib.Path(data_dir), pathlib.Path(destination)
    if not (data_dir / JOBS_DIR).is_dir():
        raise BackupError(data_dir, f"not a samplerd --data_dir (no {JOBS_DIR}/ directory)")
    if destination.exists() or destination.is_symlink():
        raise BackupError(destination, "exists; give a new directory")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{destination.name}.",
                                                suffix=".partial", dir=destination.parent))
    except OSError as e:
        raise BackupError(destination, f"cannot create it: {e.strerror}") from None
    summary = BackupSummary(jobs=0, files=0, linked_bytes=0, copied_bytes=0, server_pid=None,
                            frozen_ms=0.0)
    try:
        (staging / JOBS_DIR).mkdir()
        with _no_writes(data_dir) as quiet:
            _copy_jobs(data_dir, staging, summary)
        summary.server_pid, summary.frozen_ms = quiet.server_pid, quiet.frozen_ms
        _fsync_tree(staging)
        if destination.exists() or destination.is_symlink():
            raise BackupError(destination, "was created by someone else during the backup")
        os.rename(staging, destination)
        _fsync(destination.parent)
    except OSError as e:
        raise BackupError(e.filename or destination, e.strerror) from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return summary
