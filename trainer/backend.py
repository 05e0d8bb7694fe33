"""The narrow contract between the training loop and whatever computes the model.

Two implementations: `helios` (Vulkan compute, `trainer/backends/helios.py`) and `torch`
(`trainer/backends/torch_ref.py`, the CPU reference oracle). The loop only ever talks to `Backend`.

Conventions every backend follows (see docs/TRAINER.md for parameter names and layouts):
- token arrays are int32 `[batch, block]`; targets `y` are `x` shifted one position right;
- loss is the mean cross-entropy over every token of every micro-batch of the step;
- AdamW with decoupled weight decay on 2-D+ weights except the embeddings `wte`/`wpe`, global-norm clipping;
- a step is all-or-nothing: a skipped step (NaN/Inf or spike) leaves parameters and Adam state untouched.
"""

from __future__ import annotations

import importlib
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np

from helios.ceilings.peak import Peak
from helios.registry import Registry
from trainer.config import ModelConfig, OptimConfig
from trainer.errors import BackendUnavailableError

COUNTER_KEYS = ("dispatches", "submits", "barriers", "host_waits", "pool_bytes", "pool_regions", "pool_classes",
                "device_allocs", "pool_peak_in_use")
# State a backend keeps beyond parameters and AdamW moments (helios: its dropout RNG's forward-pass count and
# fp16's dynamic loss scale); every backend loads a checkpoint that has or lacks these.
OTHER_BACKENDS_STATE = frozenset({"rng_forwards", "loss_scale"})
# Counters that grow monotonically; the loop logs their per-step difference. The pool_* ones are gauges.
CUMULATIVE_COUNTERS = ("dispatches", "submits", "barriers", "host_waits", "device_allocs")


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step reports. Times are host wall-clock milliseconds.

    skipped: None (applied), "nan" (NaN/Inf loss or grad norm), "spike" (grad_norm > spike_threshold) or
    "overflow" (fp16 gradients overflowed at the loss scale: the scale was halved on the device).
    clip_coef: the factor gradients were scaled by (1.0 when not clipped).
    replayed / record_ms: whether the optimizer step was a replay, and the host recording time.
    wait_ms: time the host spent blocked waiting on the device (the step's one host read).
    comm_ms: data parallelism: the gradient reduce, which also waits for this rank's forward and backward on the
    device (a replayed step's fwd_ms is only its submit), then downloads, Allreduces and uploads (0 on one rank).
    """

    loss: float
    grad_norm: float
    clip_coef: float
    skipped: str | None
    fwd_ms: float
    bwd_ms: float
    opt_ms: float
    wait_ms: float
    replayed: bool = False  # the optimizer step ran from a captured command buffer (no host recording)
    record_ms: float = 0.0  # host time spent recording commands (fwd + bwd + opt; 0 for replayed parts)
    dtype: str = "fp32"  # what the model computed in ("fp32", "bf16", "fp16")
    loss_scale: float | None = None  # fp16's dynamic loss scale after this step (None without scaling)
    loss_scale_overflows: int | None = None  # fp16: steps skipped for overflow so far in this run (device counter)
    comm_ms: float = 0.0  # data parallelism: the gradient reduce, with its wait for the device (see above)


def _import_backends() -> None:
    importlib.import_module("trainer.backends")  # the package imports each backend module (none imports torch)


# name -> Backend class; a Backend subclass that declares `name = "..."` registers itself when its module loads.
_BACKENDS: Registry[type[Backend]] = Registry("backend", discover=_import_backends, missing=BackendUnavailableError)


@dataclass(frozen=True)
class SampleStats:
    """What the last `generate` did: tokens drawn, how often the window slid (a KV cache's refills past
    block_size, see `window_start`), and its wall seconds."""

    tokens: int = 0
    refills: int = 0
    seconds: float = 0.0


class Backend(ABC):
    """A model plus its AdamW optimizer on some device. A concrete backend declares `name` (its --backend
    value), which registers the class by that name."""

    name: str
    cfg: ModelConfig  # the model's config (generate reads its block_size)
    kernel_choices: bool = False  # whether helios's selection rules choose its kernels (train.tune="auto" tunes them)
    sample_stats: SampleStats = SampleStats()  # set by each generate()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            _BACKENDS.add(cls.name, cls, f"{cls.__module__}.{cls.__qualname__}")

    @classmethod
    @abstractmethod
    def create(cls, model_cfg: ModelConfig, optim_cfg: OptimConfig, seed: int) -> Backend:
        """A freshly initialised model (normal(0, 0.02), residual projections 0.02/sqrt(2*n_layer)) and optimizer."""

    @abstractmethod
    def train_step(self, micro_batches: list[tuple[np.ndarray, np.ndarray]], lr: float, grad_clip: float,
                   spike_threshold: float | None, inject_nan: bool = False) -> StepResult:
        """Accumulate gradients over micro_batches, clip to grad_clip (0: off), take one AdamW step at lr.

        NaN/Inf loss or grad norm -> nothing applied, skipped="nan"; grad norm above spike_threshold ->
        nothing applied, skipped="spike". inject_nan makes the step see a NaN (a test hook).
        """

    def check_batch(self, batch_size: int, block_size: int) -> None:  # noqa: B027 (optional hook, no-op here)
        """Raise a TrainerError if a [batch_size, block_size] micro-batch cannot fit on the device (before training)."""

    @abstractmethod
    def eval_loss(self, x: np.ndarray, y: np.ndarray) -> float:
        """Mean cross-entropy of one batch, no dropout, no gradient."""

    def generate(self, prompt_ids: np.ndarray, n: int, temperature: float, top_k: int | None,
                 rng: np.random.Generator, on_token=None, top_p: float | None = None) -> np.ndarray:
        """n new token ids (int32, 1-D) continuing prompt_ids (1-D, non-empty); temperature 0 means greedy.
        `on_token(id)` is called as each token is drawn (streaming); returning False stops early. `top_k` and
        `top_p` (nucleus) narrow the draw as `sample_logits` does.

        The context is the window `window_start` keeps (at most block_size tokens; past block_size it slides by
        half a window at a time); sampling draws only from rng. After the call, `sample_stats` says what it did.
        This is every backend's one sampling loop; a backend supplies the logits through `decoding`.
        """
        ids = [int(i) for i in np.asarray(prompt_ids).reshape(-1)]
        if not ids:
            raise ValueError("generate needs a non-empty prompt")
        t0 = time.perf_counter()
        out: list[int] = []
        block = self.cfg.block_size
        start, refills = first_window(len(ids), block), 0
        try:
            with self.decoding() as next_logits:
                for draw in range(n):
                    new = window_start(len(ids), start, block)
                    refills += new != start
                    fresh = draw == 0 or new != start
                    start = new
                    token = sample_logits(next_logits(ids[start:], fresh), temperature, top_k, rng, top_p)
                    ids.append(token)
                    out.append(token)
                    if on_token is not None and on_token(token) is False:
                        break
        finally:
            self.sample_stats = SampleStats(len(out), refills, time.perf_counter() - t0)
        return np.asarray(out, dtype=np.int32)

    def decoding(self) -> AbstractContextManager[Callable[[list[int], bool], np.ndarray]]:
        """`generate`'s hook: a context (eval mode, no gradients, any cache) that yields `next_logits(window, fresh)`,
        the float64 logits of the token after `window` (the ids of the current sampling window). `fresh` is True
        at the first draw and after a slide (a KV cache refills); otherwise `window` is the previous one plus the
        token just drawn."""
        raise NotImplementedError(f"the {self.name} backend cannot sample")

    @abstractmethod
    def state_dict(self) -> dict[str, np.ndarray]:
        """fp32 copies: `param.<name>`, `adam_m.<name>`, `adam_v.<name>`, plus `adam_step` (int64 scalar)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore from `state_dict()` output; raises ValueError naming the first missing/extra/misshapen key."""

    @abstractmethod
    def counters(self) -> dict[str, int]:
        """Device counters keyed by COUNTER_KEYS: the CUMULATIVE_COUNTERS since creation, pool_* as now."""

    @abstractmethod
    def num_params(self) -> int:
        """Number of trainable scalars (tied weights counted once)."""

    @abstractmethod
    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward), for throughput and MFU."""

    @abstractmethod
    def device_name(self) -> str:
        """Human-readable name of the device the model runs on."""

    world = None  # the data-parallel trainer.distributed.World given to set_world (None: one process)

    def set_world(self, world) -> None:
        """Train as one rank of `world` (a trainer.distributed.World): with size > 1, train_step averages the
        gradients (and the loss) over the ranks between backward and the optimizer update."""
        self.world = world

    def set_replay(self, on: bool) -> None:  # noqa: B027 (optional hook, no-op here)
        """Whether train_step may capture its step once and replay it (train.replay); a backend that records
        every step anyway ignores it."""

    def on_compile(self, callback) -> None:  # noqa: B027 (optional hook, no-op here)
        """Call `callback(kernel, kernels compiled so far, ms)` as the backend compiles device code (None: stop);
        a backend that compiles nothing never calls it."""

    def set_activation_checkpointing(self, mode: str) -> None:
        """"none" keeps every activation for backward; "block" recomputes each block's forward in backward."""
        self.model.checkpoint_activations = mode

    def precision(self) -> tuple[str, str]:
        """(dtype the model computes in, why: the config's choice or what "auto" decided on this device)."""
        return "fp32", "this backend computes in fp32"

    @abstractmethod
    def device_peak(self, remeasure_from: Peak | None = None) -> Peak | None:
        """The device's peak fp32 FLOP/s and its source, or None when unknown (MFU is then null).
        `remeasure_from`: a run's MFU passed 100% of that figure, so measure again where it was measured."""


def backend_names() -> list[str]:
    """Every backend's name (--backend's choices), sorted; finding them imports the backend modules, not torch."""
    return _BACKENDS.names()


def backend_class(kind: str) -> type[Backend]:
    """The Backend class named `kind`; an unknown name is a BackendUnavailableError naming the known ones."""
    return _BACKENDS.get(kind)


def create_backend(kind: str, model_cfg: ModelConfig, optim_cfg: OptimConfig, seed: int) -> Backend:
    """Create a backend by name."""
    return backend_class(kind).create(model_cfg, optim_cfg, seed)


def param_shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, from the layout table in docs/TRAINER.md (no model is built)."""
    C, V, F, qkv = m.n_embd, m.vocab_size, m.ffn_hidden, (m.n_head + 2 * m.n_kv_head) * m.head_dim
    norm_bias = m.bias and m.arch == "gpt2"
    out: dict[str, tuple[int, ...]] = {"wte.weight": (V, C)}
    if m.arch == "gpt2":
        out["wpe.weight"] = (m.block_size, C)
    linears = {"attn.c_attn": (qkv, C), "attn.c_proj": (C, m.n_head * m.head_dim)}
    if m.arch == "gpt2":
        linears |= {"mlp.c_fc": (F, C), "mlp.c_proj": (C, F)}
    else:
        linears |= {"mlp.w_gate": (F, C), "mlp.w_up": (F, C), "mlp.w_down": (C, F)}
    for i in range(m.n_layer):
        for norm in ("ln_1", "ln_2"):
            out[f"h.{i}.{norm}.weight"] = (C,)
            if norm_bias:
                out[f"h.{i}.{norm}.bias"] = (C,)
        for name, shape in linears.items():
            out[f"h.{i}.{name}.weight"] = shape
            if m.bias:
                out[f"h.{i}.{name}.bias"] = (shape[0],)
    out["ln_f.weight"] = (C,)
    if norm_bias:
        out["ln_f.bias"] = (C,)
    if not m.tie_embeddings:
        out["lm_head.weight"] = (V, C)
    return out


def count_params(model_cfg: ModelConfig) -> int:
    """Number of trainable scalars of a config (tied weights once), without building the model."""
    return sum(math.prod(shape) for shape in param_shapes(model_cfg).values())


def flops_per_token(model_cfg: ModelConfig, n_params: int) -> float:
    """PaLM-style training FLOPs per token: 6*N (N without position embeddings) + 12*L*H*head_dim*T attention."""
    m = model_cfg
    n = n_params - (m.block_size * m.n_embd if m.arch == "gpt2" else 0)
    return 6.0 * n + 12.0 * m.n_layer * m.n_head * m.head_dim * m.block_size


def window_start(length: int, start: int, block_size: int) -> int:
    """Where the context of the next draw starts, for `length` tokens so far and the current window `start`.

    The window grows until it holds block_size tokens; the draw after that slides it to the last
    block_size // 2 tokens (at least 1), which then grow again. A kept token's K/V depend on its position
    (gpt2's learned embeddings) and, past the first layer, on the tokens it attended to, which a slide drops:
    so a slide refills a KV cache, once per block_size // 2 + 1 tokens instead of once per token (a one-token
    slide each draw). Every backend uses this window, so both sample the same tokens for the same seed.
    """
    if length - start <= block_size:
        return start
    return length - max(1, block_size // 2)


def first_window(prompt_length: int, block_size: int) -> int:
    """The window of the first draw: the prompt's last block_size tokens."""
    return max(0, prompt_length - block_size)


def window_refills(prompt_length: int, n: int, block_size: int) -> int:
    """How many times `window_start` slides the window over n draws after a prompt (a KV cache's refills)."""
    start, refills = first_window(prompt_length, block_size), 0
    for length in range(prompt_length, prompt_length + n):
        new = window_start(length, start, block_size)
        refills += new != start
        start = new
    return refills


def sample_logits(logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator,
                  top_p: float | None = None) -> int:
    """One token id from float64 logits: greedy at temperature 0, else softmax(logits/T) over the top_k, then
    over the smallest set of likeliest tokens whose probability reaches top_p (nucleus sampling; None or 1: all)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits / temperature
    if top_k is not None and 0 < top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max())
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, kind="stable")
        kept = order[:int(np.searchsorted(np.cumsum(p[order]) / p.sum(), top_p)) + 1]  # the likeliest always
        p = np.where(np.isin(np.arange(p.size), kept), p, 0.0)
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), z.size - 1))
