"""An independent check of the recorder's synchronisation, for tests on devices that never show a race.

lavapipe runs the commands of a queue one after another, so a missing barrier never corrupts a result
there; a discrete GPU overlaps them. `HazardShadow` watches what a runtime records and keeps its own
account of device accesses by (VkBuffer, byte range), never by the pool's region keys, and notes every:
- command that touches bytes an earlier, unfinished command wrote (or writes bytes one read) with no
  barrier recorded between them;
- region handed out for host access while an unfinished command still touches it (the pool's reuse rule;
  a region handed out for device commands may be in use: those commands are checked like any other);
- side copy (`copy_now`, which runs before the open batch) of bytes the open batch writes.
"""

from __future__ import annotations


class _Lib:
    """The binding's raw library with pipeline barriers reported to the shadow first."""

    def __init__(self, lib, shadow: HazardShadow):
        self._lib, self._shadow = lib, shadow

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def vkCmdPipelineBarrier(self, cb, src, dst, *rest):
        self._shadow.on_barrier(cb, dst)
        return self._lib.vkCmdPipelineBarrier(cb, src, dst, *rest)

    def vkCmdPipelineBarrier2(self, cb, dependency):
        self._shadow.on_barrier(cb, None)  # the recorder's barrier2 orders device work only
        return self._lib.vkCmdPipelineBarrier2(cb, dependency)


class HazardShadow:
    """Installs itself on `runtime` (its recorder and pools); `errors` lists what it found."""

    def __init__(self, runtime):
        self.rt = runtime
        rec = self.rec = runtime.recorder
        self.ffi = rec.ffi
        self.host_stage = rec.vk.VK_PIPELINE_STAGE_HOST_BIT
        self.entries: list[tuple[int, int, int, bool, int]] = []  # (buffer, lo, hi, write, batch value)
        self.errors: list[str] = []
        self.commands = 0
        rec.lib = _Lib(rec.lib, self)
        self._wrap(rec, "dispatch", self._dispatch_accesses)
        self._wrap(rec, "copy", lambda src, s_lo, dst, d_lo, n: [(src.buffer, s_lo, s_lo + n, 1),
                                                                 (dst.buffer, d_lo, d_lo + n, 2)])
        self._wrap(rec, "fill", lambda storage, lo, n, word: [(storage.buffer, lo, lo + n, 2)])
        copy_now = rec.copy_now

        def checked_copy_now(src, src_lo, dst, dst_lo, nbytes):
            buf = self._id(src.buffer)
            for b, lo, hi, write, value in self.entries:
                if b == buf and write and value == rec.open_value and lo < src_lo + nbytes and src_lo < hi:
                    self.errors.append(f"side copy reads bytes [{src_lo}, {src_lo + nbytes}) that the open batch "
                                       "writes later")
            copy_now(src, src_lo, dst, dst_lo, nbytes)  # finished on return: adds nothing to track

        rec.copy_now = checked_copy_now
        for pool in (runtime.pool, runtime.staging):
            if pool is not None:
                self._wrap_acquire(pool)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _id(self, buffer) -> int:
        return int(self.ffi.cast("uintptr_t", buffer))

    def _live(self) -> list[tuple[int, int, int, bool, int]]:
        done = self.rec.completed  # the recorder skips barriers only on what it knows has completed
        self.entries = [e for e in self.entries if e[4] > done]
        return self.entries

    def on_barrier(self, cb, dst_stage) -> None:
        if dst_stage == self.host_stage:
            return  # the end-of-batch barrier for host reads orders no later device command
        if cb == self.rec._cb:  # in the open batch: orders everything recorded or submitted before it
            self.entries = []
        else:  # a side copy's barrier, submitted before the open batch: covers submitted work only
            self.entries = [e for e in self.entries if e[4] > self.rec.submitted]

    def _dispatch_accesses(self, pipe, buffers, *rest):
        # A tensor's descriptor bytes start with its VkBuffer handle.
        return [(int.from_bytes(t._span[3][:8], "little"), t._span[1], t._span[2], pipe.access[k])
                for k, t in enumerate(buffers)]

    def _wrap(self, rec, name: str, accesses) -> None:
        original = getattr(rec, name)

        def checked(*args):
            original(*args)  # a barrier it records comes before the command: on_barrier has seen it
            self._note(name, [(b if isinstance(b, int) else self._id(b), lo, hi, a)
                              for b, lo, hi, a in accesses(*args)])

        setattr(rec, name, checked)

    def _note(self, what: str, accesses) -> None:
        self.commands += 1
        live = self._live()
        for buf, lo, hi, access in accesses:
            for b, elo, ehi, write, _ in live:
                if b == buf and elo < hi and lo < ehi and (write or access & 2):
                    kind = ("write" if access & 2 else "read") + "-after-" + ("write" if write else "read")
                    self.errors.append(f"{what} #{self.commands}: {kind} on bytes [{lo}, {hi}) without a barrier")
        value = self.rec.open_value
        for buf, lo, hi, access in accesses:
            if access & 1:
                live.append((buf, lo, hi, False, value))
            if access & 2:
                live.append((buf, lo, hi, True, value))

    def _wrap_acquire(self, pool) -> None:
        original = pool.acquire

        def checked(nbytes, *, host_access=False):
            storage = original(nbytes, host_access=host_access)
            if not host_access:
                return storage  # device commands come first: _note checks them against the old owner's
            buf, lo, hi = self._id(storage.buffer), storage.base, storage.base + storage.size
            for b, elo, ehi, _, value in self._live():
                if b == buf and elo < hi and lo < ehi:
                    self.errors.append(f"{pool.name} pool handed out bytes [{lo}, {hi}) for host access that "
                                       f"batch {value} still uses (completed: {self.rec.completed})")
            return storage

        pool.acquire = checked
