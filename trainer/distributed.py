"""Data parallelism over MPI (mpi4py): which rank this process is, the one gradient all-reduce per step,
agreement on stop/save requests, and ending the whole job when one rank fails.

    mpiexec -n 2 python -m trainer run configs/shakespeare.toml     # or: python -m trainer run ... --nproc 2

Every rank runs the same trainer with the same seed. The data sampler draws the *global* batch of
world x batch_size windows (the same on every rank) and each rank trains on its own slice, so N ranks
with batch B see exactly the tokens one rank with batch N*B sees, and the sampler state in a checkpoint
covers all ranks. After backward each rank's gradient arena (and its loss) is summed over the ranks
and divided by N on the host (`Allreduce`, MPI.IN_PLACE): the device-side clipping and NaN/spike
decisions then see the same numbers on every rank. Rank 0 alone writes checkpoints, metrics, samples
and plots.

`--nproc N` is `relaunch`: it passes SIGTERM/SIGINT/SIGUSR1 on to every rank through mpiexec, and neither
mpiexec nor a rank outlives it (parent-death signals). A resume on another rank count keeps the global batch
(trainer/resume.py).

Under `--nproc` a watchdog (train.watchdog_s) ends a job one of whose ranks makes no progress: each rank touches
a heartbeat file after each step and while it waits in a collective; the launcher names a rank whose file is older
than watchdog_s, the others leave their collective (`PeerStalled`), rank 0 checkpoints when it is not the stalled
one, and the launcher ends every process and exits STALLED_EXIT.

Without an MPI launcher (no PMI/OMPI environment) nothing here imports mpi4py: `World()` is one rank.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from helios.device import select_device
from trainer import env
from trainer.errors import TrainerError

HEARTBEAT_DIR_VAR = env.HEARTBEAT_DIR_VAR
STALLED_EXIT = 4  # the launcher's exit code when its watchdog ended the job over a stalled rank
STALL_GRACE_S = 60.0  # how long the launcher waits for the other ranks' checkpoint after naming a stalled rank
_BEAT_EVERY_S = 0.25  # a waiting rank touches its heartbeat at most this often


class PeerStalled(Exception):
    """Raised in a rank waiting in a collective once the launcher's watchdog has named a stalled rank."""

    def __init__(self, rank: int):
        super().__init__(f"rank {rank} made no progress")
        self.rank = rank


def launched_size() -> int:
    """The number of ranks an MPI launcher started this process among (1 outside one)."""
    return env.mpi_world_size()


@dataclass
class World:
    """This process's place in the job: rank, size, local rank on its machine, and the communicator."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    comm: Any = field(default=None, repr=False)
    reduce_ms: float = 0.0  # time in the last Allreduce (the transfer, plus waiting for the slowest rank)
    heartbeat_dir: str | None = None  # the --nproc launcher's watchdog reads this rank's heartbeat file there
    _armed: bool = field(default=False, repr=False)  # watched from this rank's first completed step on
    _last_beat: float = field(default=0.0, repr=False)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one writer of checkpoints, metrics, samples and plots."""
        return self.rank == 0

    def mean_(self, flat: np.ndarray) -> np.ndarray:
        """Average a float32 host array over the ranks, in place (one Allreduce)."""
        if self.size > 1:
            from mpi4py import MPI

            t0 = time.perf_counter()
            self._wait(self.comm.Iallreduce(MPI.IN_PLACE, flat, op=MPI.SUM))
            self.reduce_ms = (time.perf_counter() - t0) * 1000.0
            flat *= np.float32(1.0 / self.size)
        return flat

    def any_(self, flags: Sequence[bool]) -> list[bool]:
        """Each flag OR-ed over the ranks: a stop or save request seen by one rank is acted on by all."""
        if self.size == 1:
            return [bool(f) for f in flags]
        from mpi4py import MPI

        buf = np.asarray(flags, dtype=np.int32)
        self._wait(self.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.MAX))
        return [bool(f) for f in buf]

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.size > 1:
            self._wait(self.comm.Ibarrier())

    def _wait(self, request: Any) -> None:
        """Wait for a nonblocking collective: sleeping between tests (MPICH's blocking wait spins a core at 100%
        for as long as a peer is late), touching the heartbeat (this rank is alive), and raising PeerStalled
        once the launcher's watchdog has named a stalled rank (the collective would never complete)."""
        pause = 0.0
        while not request.Test():
            if self.heartbeat_dir is not None:
                try:
                    with open(os.path.join(self.heartbeat_dir, "stalled")) as f:
                        raise PeerStalled(int(f.read() or -1))
                except (FileNotFoundError, ValueError):
                    pass
                self.beat(waiting=True)
            time.sleep(pause)
            pause = min(0.005, pause + 0.0002)  # the first tests come at once: a short wait stays short

    def beat(self, waiting: bool = False) -> None:
        """Tell the launcher's watchdog this rank is alive: after each step (the first one arms the watch, so a
        first step's compile is not timed) and, rate-limited, while it waits in a collective or evaluates."""
        if self.heartbeat_dir is None or (waiting and not self._armed):
            return
        now = time.monotonic()
        if waiting and now - self._last_beat < _BEAT_EVERY_S:
            return
        self._armed, self._last_beat = True, now
        path = os.path.join(self.heartbeat_dir, f"rank-{self.rank}")
        try:
            os.utime(path)
        except FileNotFoundError:
            open(path, "w").close()
        except OSError:
            pass

    def wait_to_be_ended(self, note: str) -> None:
        """After PeerStalled (and rank 0's checkpoint): tell the launcher this rank is done (`note`: the checkpoint
        written, or "") and wait for it to end the job; MPI cannot finalize with a peer stopped."""
        if self.heartbeat_dir is not None:
            with open(os.path.join(self.heartbeat_dir, f"done-{self.rank}.tmp"), "w") as f:
                f.write(note)
            os.replace(os.path.join(self.heartbeat_dir, f"done-{self.rank}.tmp"),
                       os.path.join(self.heartbeat_dir, f"done-{self.rank}"))
        time.sleep(STALL_GRACE_S + 30.0)
        sys.stderr.flush()
        os._exit(STALLED_EXIT)

    def abort(self, code: int) -> None:
        """End every rank of the job (after this one has said why): MPI_Abort, so no rank waits forever."""
        if self.size > 1 and self.comm is not None:
            sys.stderr.flush()
            self.comm.Abort(code)


_world: World | None = None


def world() -> World:
    """The process's World, initialising MPI on first use when a launcher started several ranks."""
    global _world
    if _world is None:
        _world = _init()
    return _world


def _init() -> World:
    size = launched_size()
    if size <= 1:
        return World()
    # A rank whose launcher-side parent (hydra's proxy, orted, slurmstepd) dies abruptly has no one to stop it or
    # to reach its peers through: end it with its parent (mpiexec's own death is passed on by the proxy).
    die_with_parent(signal.SIGKILL)
    if os.getppid() == 1:
        raise TrainerError("this rank's MPI launcher exited while it started; start the job again")
    try:
        from mpi4py import MPI
    except ImportError:
        raise TrainerError(f"started as one of {size} MPI ranks, but mpi4py is not installed: "
                           "pip install mpi4py mpich (make test installs both)") from None
    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    w = World(rank=comm.Get_rank(), size=comm.Get_size(), local_rank=local, comm=comm,
              heartbeat_dir=env.heartbeat_dir())
    # A machine with several GPUs gives each local rank its own; an explicit HELIOS_DEVICE wins. On one device
    # (or lavapipe) the ranks share it.
    select_device(local_rank=local)
    return w


def shard(batch: tuple[np.ndarray, np.ndarray], w: World) -> tuple[np.ndarray, np.ndarray]:
    """This rank's rows of a global batch (world.size equal slices)."""
    x, y = batch
    per = x.shape[0] // w.size
    rows = slice(w.rank * per, (w.rank + 1) * per)
    return x[rows], y[rows]


def mpiexec() -> str:
    """The mpiexec beside this Python (the `mpich` wheel puts it in the venv), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if found is None:
        raise TrainerError("--nproc needs mpiexec: pip install mpich mpi4py (make test installs both), or "
                           "start the ranks yourself with your cluster's MPI launcher")
    return found


# The signals the launcher passes on to mpiexec, which passes them on to every rank (MPICH's hydra does so
# for all three; tested in tests/trainer/test_distributed.py).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(signum: int) -> None:
    """Ask Linux to send this process `signum` when its parent exits (prctl PR_SET_PDEATHSIG; nothing elsewhere).
    A parent that exited before this call is not noticed: callers compare os.getppid() afterwards."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)


class Watchdog:
    """The launcher's side of the progress watch: the ranks' heartbeat files in a directory of its own."""

    def __init__(self, nproc: int, timeout_s: float):
        self.nproc, self.timeout_s = nproc, timeout_s
        self.dir = tempfile.mkdtemp(prefix="helios-heartbeat-")

    def stalled(self) -> int | None:
        """The rank whose heartbeat is oldest and older than timeout_s (ranks without one yet are not watched)."""
        now, ages = time.time(), {}
        for rank in range(self.nproc):
            try:
                ages[rank] = now - os.stat(os.path.join(self.dir, f"rank-{rank}")).st_mtime
            except OSError:
                continue
        late = [rank for rank, age in ages.items() if age > self.timeout_s]
        return max(late, key=ages.__getitem__) if late else None

    def name(self, rank: int) -> None:
        """Tell the other ranks (waiting in a collective) that `rank` stalled."""
        with open(os.path.join(self.dir, "stalled.tmp"), "w") as f:
            f.write(str(rank))
        os.replace(os.path.join(self.dir, "stalled.tmp"), os.path.join(self.dir, "stalled"))

    def done(self, rank: int) -> str | None:
        """What a rank reported when it finished after a stall (its checkpoint, or ""), None before it did."""
        try:
            with open(os.path.join(self.dir, f"done-{rank}")) as f:
                return f.read()
        except OSError:
            return None

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def end_stalled(job: Any, watch: Watchdog, rank: int) -> int:
    """Report a stalled rank in one line, let the others checkpoint (rank 0 writes), end every process of the job
    and return STALLED_EXIT."""
    n = watch.nproc
    print(f"trainer: error: rank {rank} of {n} made no progress for {watch.timeout_s:g} s ([train] watchdog_s): no "
          "step completed and no collective joined (stopped, or hung in the device driver); ending the job",
          file=sys.stderr, flush=True)
    watch.name(rank)
    deadline = time.monotonic() + STALL_GRACE_S
    while (time.monotonic() < deadline and job.poll() is None
           and any(watch.done(r) is None for r in range(n) if r != rank)):
        time.sleep(0.05)
    saved = watch.done(0) if rank != 0 else None
    end_job(job.pid)
    job.wait()
    if saved:
        print(f"trainer: rank 0 wrote {saved}; the same command resumes from it", file=sys.stderr)
    else:
        why = ("rank 0, the one writer, is the stalled rank" if rank == 0 else
               f"rank 0 did not finish one within {STALL_GRACE_S:g} s")
        print(f"trainer: no checkpoint was written ({why}); the run directory keeps its latest complete "
              "checkpoint, and the same command resumes from it", file=sys.stderr)
    return STALLED_EXIT


def relaunch(nproc: int, argv: Sequence[str], check: Callable[[], float | None] | None = None) -> int:
    """Run `python -m trainer ARGV` as nproc MPI ranks and return the job's exit code.

    `check()` runs first (it raises on a config or resume the ranks would refuse) and returns the watchdog's
    timeout (train.watchdog_s; 0 or None: no watch): a rank with no progress for that long is named, the others
    checkpoint, and the launcher ends the job and returns STALLED_EXIT (see end_stalled). SIGTERM, SIGINT and SIGUSR1
    sent to this launcher reach every rank (through mpiexec), which agree on a step, checkpoint once and exit;
    the launcher then exits with their code. mpiexec runs in its own process group, so a terminal's Ctrl-C
    reaches it once (from here), not twice. A second Ctrl-C is not passed on (to mpiexec it means "abort",
    which ends in MPI's error noise and exit 255): as torchrun does, the launcher ends the job's processes
    itself and exits 130 with one line. If this launcher is killed outright, mpiexec gets SIGTERM from the
    kernel (a parent-death signal) and the ranks stop the same way: no rank outlives its launcher.
    """
    import subprocess

    if nproc < 1:
        raise TrainerError(f"--nproc must be at least 1, got {nproc}")
    timeout_s = check() if check is not None else None
    watch = Watchdog(nproc, timeout_s) if timeout_s and nproc > 1 else None
    cmd = [mpiexec(), "-n", str(nproc), sys.executable, "-m", "trainer", *argv]
    # The ranks' environment: this process's, plus where the watchdog reads their heartbeats.
    child_env = dict(os.environ, **({HEARTBEAT_DIR_VAR: watch.dir} if watch is not None else {}))
    launcher = os.getpid()

    def own_group_dying_with_launcher() -> None:  # runs in the child between fork and exec
        os.setpgid(0, 0)
        die_with_parent(signal.SIGTERM)
        if os.getppid() != launcher:  # the launcher died before prctl took hold
            os._exit(1)

    jobs: list[subprocess.Popen] = []
    pending: list[int] = []  # signals that arrived while mpiexec was being started: passed on once it runs
    interrupts = [0]  # SIGINTs so far: the second ends the job at once

    def forward(signum: int, _frame) -> None:
        if signum == signal.SIGINT:
            interrupts[0] += 1
            if interrupts[0] > 1:
                if jobs:
                    end_job(jobs[0].pid)
                return
        if watch is not None and signum != signal.SIGUSR1:  # a stalled rank 0 could not acknowledge it
            os.write(2, f"trainer: {signal.Signals(signum).name}: passed on to the ranks, which stop after the step "
                        f"in flight with a checkpoint; a rank that makes no progress is ended after "
                        f"{watch.timeout_s:g} s\n".encode())
        if jobs:
            jobs[0].send_signal(signum)
        else:
            pending.append(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        # stdin from /dev/null: mpiexec is not in the terminal's foreground group, and would stop if it read it.
        jobs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, preexec_fn=own_group_dying_with_launcher,
                                     env=child_env))
        for signum in pending:
            jobs[0].send_signal(signum)
        if interrupts[0] > 1:  # both Ctrl-Cs came while mpiexec was starting
            end_job(jobs[0].pid)
        code = None
        while code is None:
            try:
                code = jobs[0].wait(timeout=None if watch is None else min(1.0, watch.timeout_s / 4))
            except subprocess.TimeoutExpired:
                stalled = watch.stalled() if watch is not None and interrupts[0] < 2 else None
                if stalled is not None:
                    return end_stalled(jobs[0], watch, stalled)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watch is not None:
            watch.close()
    if interrupts[0] > 1:
        print("trainer: interrupted again: the ranks were stopped at once, without a checkpoint; the run directory "
              "keeps its latest complete checkpoint, and the same command resumes from it", file=sys.stderr)
        return 130
    if code < 0:  # mpiexec itself was killed by a signal (not through this launcher)
        code = 128 - code
    if code not in (0, 2, 130):  # 2 and 130: a rank has said why already
        print(f"trainer: error: the {nproc}-process job ended with exit code {code}: a rank died or was killed and "
              "MPI ended the others; the run directory keeps its latest complete checkpoint, and the same "
              "command resumes from it", file=sys.stderr)
    return code


def _children() -> dict[int, list[int]]:
    """Each live process's child pids, from /proc (empty where there is no /proc)."""
    out: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in filter(str.isdigit, entries):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(name))
    return out


def end_job(root: int, wait_s: float = 5.0) -> None:
    """SIGKILL mpiexec (pid `root`) and every process below it on this machine: its MPI proxies and the ranks
    (each in its own session, so no process group reaches them all). All are stopped (SIGSTOP) before any is
    killed, so none lives to print MPI's error noise about the others; then waits up to wait_s for them to go.
    Ranks on other machines end with their proxies (die_with_parent)."""
    children, tree, i = _children(), [root], 0
    while i < len(tree):
        tree += children.get(tree[i], [])
        i += 1
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(_running(pid) for pid in tree[1:]):
        time.sleep(0.02)


def _running(pid: int) -> bool:
    """Whether pid is alive and not a zombie (a killed rank waiting to be reaped is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
