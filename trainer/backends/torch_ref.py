"""The PyTorch reference backend: fp32 on the CPU, the oracle the helios backend is checked against.

AdamW is written out (not torch.optim) so its state is exactly the `adam_m.*`/`adam_v.*`/`adam_step`
the checkpoint format names, and so a skipped step provably touches nothing.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time

import numpy as np

from helios.ceilings.peak import Peak
from trainer import env
from trainer.backend import (
    COUNTER_KEYS,
    OTHER_BACKENDS_STATE,
    Backend,
    StepResult,
    flops_per_token,
)
from trainer.config import ModelConfig, OptimConfig
from trainer.errors import BackendUnavailableError

torch = F = GPT = None  # PyTorch, its functional module and the twin model: imported by the first TorchBackend


def _import_torch() -> None:
    """Import PyTorch on first use, so that finding the backends (trainer.backend) never loads it."""
    global torch, F, GPT
    if torch is not None:
        return
    env.prefer_passive_omp()
    try:
        import torch as torch_module
        import torch.nn.functional as functional
    except ModuleNotFoundError:  # torch is a test-only dependency
        raise BackendUnavailableError("the torch backend needs PyTorch: pip install 'torch==2.13.0'") from None
    from trainer.backends.torch_model import GPT as twin  # after the torch check, for its clear message

    torch, F, GPT = torch_module, functional, twin


def _no_grad(method):
    """`torch.no_grad()` around a method, without needing torch when the class is defined."""

    @functools.wraps(method)
    def without_grad(*args, **kwargs):
        with torch.no_grad():
            return method(*args, **kwargs)

    return without_grad


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


class TorchBackend(Backend):
    """GPT + AdamW in PyTorch on the CPU."""

    name = "torch"  # --backend torch (declaring it registers this class in trainer.backend)

    def __init__(self, model_cfg: ModelConfig, optim_cfg: OptimConfig, seed: int):
        _import_torch()
        torch.set_num_threads(env.torch_threads())
        self.cfg, self.optim, self.seed = model_cfg, optim_cfg, seed
        self.model = GPT(model_cfg)
        self.model.init_weights(seed)
        self.model.train()
        self.names = [name for name, _ in self.model.named_parameters()]
        self.params = [p for _, p in self.model.named_parameters()]
        self.decay = [self.model.decays(n, p) for n, p in zip(self.names, self.params, strict=True)]
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.step = 0

    @classmethod
    def create(cls, model_cfg: ModelConfig, optim_cfg: OptimConfig, seed: int) -> TorchBackend:
        """A freshly initialised model and zeroed AdamW state."""
        return cls(model_cfg, optim_cfg, seed)

    def _loss(self, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        logits = self.model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)))
        target = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), target.view(-1))

    def train_step(self, micro_batches: list[tuple[np.ndarray, np.ndarray]], lr: float, grad_clip: float,
                   spike_threshold: float | None, inject_nan: bool = False) -> StepResult:
        """Forward/backward over micro_batches, one global-norm clip and one AdamW update (or a skip)."""
        if self.cfg.dropout > 0:
            # Dropout masks come from the step number, so a resumed run draws the same masks without saving RNGs.
            size, rank = (self.world.size, self.world.rank) if self.world is not None else (1, 0)
            torch.manual_seed(self.seed * 1_000_003 + self.step * size + rank)  # each rank its own masks
        for p in self.params:
            p.grad = None
        n = len(micro_batches)
        fwd_ms = bwd_ms = 0.0
        loss_sum = torch.zeros(())
        for x, y in micro_batches:
            t0 = time.perf_counter()
            loss = self._loss(x, y)
            fwd_ms += _ms(t0)
            t0 = time.perf_counter()
            (loss / n).backward()
            bwd_ms += _ms(t0)
            loss_sum += loss.detach()
        t0 = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.world is not None and self.world.size > 1:
            loss_sum = self._reduce_gradients(grads, loss_sum)
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        if inject_nan:
            norm, loss_sum = norm * float("nan"), loss_sum * float("nan")
        opt_ms = _ms(t0)
        t0 = time.perf_counter()
        loss_val, norm_val = torch.stack([loss_sum / n, norm]).tolist()  # the step's one host read
        wait_ms = _ms(t0)
        t0 = time.perf_counter()
        skipped, clip_coef = None, 1.0
        if not (math.isfinite(loss_val) and math.isfinite(norm_val)):
            skipped = "nan"
        elif spike_threshold is not None and norm_val > spike_threshold:
            skipped = "spike"
        else:
            if grad_clip > 0:
                clip_coef = min(1.0, grad_clip / (norm_val + 1e-6))
            self._adamw(grads, lr, clip_coef)
        for p in self.params:
            p.grad = None
        opt_ms += _ms(t0)
        return StepResult(loss_val, norm_val, clip_coef, skipped, fwd_ms, bwd_ms, opt_ms, wait_ms)

    @_no_grad
    def _reduce_gradients(self, grads: list[torch.Tensor], loss_sum: torch.Tensor) -> torch.Tensor:
        """Average the gradients (in place) and the loss over the data-parallel ranks (one MPI Allreduce)."""
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss_sum.reshape(1)]).numpy()
        self.world.mean_(flat)
        at = 0
        for g in grads:
            g.copy_(torch.from_numpy(flat[at:at + g.numel()]).view_as(g))
            at += g.numel()
        return torch.tensor(flat[-1])

    @_no_grad
    def _adamw(self, grads: list[torch.Tensor], lr: float, clip_coef: float) -> None:
        """p <- p*(1 - lr*wd) [decayed only] - lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps), g scaled by clip_coef.

        The same arithmetic as helios/kernels/optim/adamw.py (and torch.optim.AdamW), so the two backends agree.
        """
        b1, b2 = self.optim.betas
        wd, eps = self.optim.weight_decay, self.optim.eps
        self.step += 1
        bc1, sqrt_bc2 = 1.0 - b1 ** self.step, math.sqrt(1.0 - b2 ** self.step)
        for p, g, m, v, decay in zip(self.params, grads, self.m, self.v, self.decay, strict=True):
            if clip_coef != 1.0:
                g = g * clip_coef
            m.mul_(b1).add_(g, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(g, g, value=1.0 - b2)
            if decay and wd:
                p.mul_(1.0 - lr * wd)
            p.addcdiv_(m, v.sqrt().div_(sqrt_bc2).add_(eps), value=-lr / bc1)

    @_no_grad
    def eval_loss(self, x: np.ndarray, y: np.ndarray) -> float:
        """Mean cross-entropy without dropout or gradients."""
        self.model.eval()
        try:
            return float(self._loss(x, y))
        finally:
            self.model.train()

    @contextlib.contextmanager
    def decoding(self):
        """Full recompute of the window per token: this is the reference, not the fast path."""
        def next_logits(window: list[int], fresh: bool) -> np.ndarray:
            return self.model(torch.tensor([window], dtype=torch.int64))[0, -1].double().numpy()

        self.model.eval()
        try:
            with torch.no_grad():
                yield next_logits
        finally:
            self.model.train()

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of parameters and AdamW moments, plus the AdamW step count."""
        out: dict[str, np.ndarray] = {}
        for name, p, m, v in zip(self.names, self.params, self.m, self.v, strict=True):
            out[f"param.{name}"] = p.detach().numpy().copy()
            out[f"adam_m.{name}"] = m.numpy().copy()
            out[f"adam_v.{name}"] = v.numpy().copy()
        out["adam_step"] = np.array(self.step, dtype=np.int64)
        return out

    @_no_grad
    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Copy a state_dict in; the key set and every shape must match this model exactly."""
        expected = set(self.state_dict_keys())
        keys = set(state) - OTHER_BACKENDS_STATE  # the helios backend's own extras: a checkpoint is a checkpoint
        missing, extra = sorted(expected - keys), sorted(keys - expected)
        if missing or extra:
            raise ValueError(f"state keys differ: missing {missing[:3]}, unexpected {extra[:3]}")
        for name, p, m, v in zip(self.names, self.params, self.m, self.v, strict=True):
            for prefix, dst in (("param", p), ("adam_m", m), ("adam_v", v)):
                src = np.asarray(state[f"{prefix}.{name}"])
                if tuple(src.shape) != tuple(dst.shape):
                    raise ValueError(f"{prefix}.{name} has shape {list(src.shape)}, the model needs {list(dst.shape)}")
                dst.copy_(torch.from_numpy(np.ascontiguousarray(src, dtype=np.float32)))
        self.step = int(np.asarray(state["adam_step"]).reshape(()))

    def state_dict_keys(self) -> list[str]:
        """Every key state_dict() produces."""
        return [f"{k}.{n}" for n in self.names for k in ("param", "adam_m", "adam_v")] + ["adam_step"]

    def counters(self) -> dict[str, int]:
        """All zeros: the CPU reference has no device queue or memory pool."""
        return dict.fromkeys(COUNTER_KEYS, 0)

    def num_params(self) -> int:
        """Trainable scalars (a tied head shares wte)."""
        return sum(p.numel() for p in self.params)

    def flops_per_token(self) -> float:
        """6N + attention term; see trainer.backend.flops_per_token."""
        return flops_per_token(self.cfg, self.num_params())

    def device_name(self) -> str:
        """The CPU and torch's thread count."""
        return f"CPU (torch {torch.__version__}, {torch.get_num_threads()} threads)"

    def device_peak(self, remeasure_from: Peak | None = None) -> Peak | None:
        """Unknown for a CPU: MFU is reported as null."""
        return None

