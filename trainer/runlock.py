"""One trainer per run directory: an exclusive, non-blocking fcntl.flock on RUN_DIR/.lock."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from trainer.errors import RunLockedError, TrainerError

LOCK_FILE = ".lock"


class RunLock:
    """Holds RUN_DIR/.lock for the life of a run; the kernel drops it if the process dies."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock or raise RunLockedError naming the holder's pid."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise TrainerError(f"cannot create lock file {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0)
            os.close(fd)
            raise _locked(self.path, holder) from None
        # The pid is written only once the lock is held, so a refused second run never touches the file.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (the file stays: deleting it would race with a waiting process)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _locked(path: Path, holder: bytes) -> RunLockedError:
    pid = holder.decode("ascii", "replace").strip() or "unknown"
    return RunLockedError(f"run directory {path.parent} is in use by another trainer (pid {pid}); "
                          "wait for it to finish or stop it (SIGTERM checkpoints and exits)")


def check_free(run_dir: Path) -> None:
    """Raise RunLockedError if another trainer holds RUN_DIR's lock now, without taking it or writing the file:
    the `--nproc` launcher's check, so a locked run is one line before any rank starts (rank 0 still locks)."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no lock file (a new run), or one we cannot read: rank 0 says what is wrong, if anything
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _locked(path, os.pread(fd, 32, 0)) from None
    finally:
        os.close(fd)  # drops the lock if we took it
