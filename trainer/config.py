"""Training configuration: TOML sections loaded into validated, frozen dataclasses.

One dataclass per section (`[model]`, `[data]`, `[optim]`, `[schedule]`, `[train]`, `[run]`). Every
problem (malformed TOML, unknown section or key, wrong type, impossible value) raises `ConfigError`
whose message names the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autograd.nn.gpt import MODEL_DTYPES, GPTConfig
from trainer.data import NAMED_DATASETS
from trainer.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig(GPTConfig):
    """The network: GPT-2 style (learned positions, LayerNorm, GELU) or LLaMA style (RoPE, RMSNorm, SwiGLU, GQA).

    Its fields, defaults and derived widths (head_dim, ffn_hidden) are autograd's GPTConfig: one definition,
    so the helios model and the torch reference twin can never disagree on a shape.
    """


@dataclass(frozen=True)
class DataConfig:
    """Where the text comes from and how it is tokenized."""

    dataset: str | None = None  # a named dataset ("shakespeare"); exclusive with path
    # A UTF-8 text file, a .jsonl file (each record's text_field is a document), a folder (its *.txt and *.jsonl
    # files, by name) or a list of these; documents are joined with <|endoftext|> lines between them.
    path: str | tuple[str, ...] | None = None
    text_field: str = "text"  # the field of each .jsonl record that holds its text
    tokenizer: str = "bpe"
    val_fraction: float = 0.1
    root: str = "data"  # where named datasets are downloaded (and their token caches kept)
    cache_dir: str | None = None  # token caches here instead of next to the text (for read-only data folders)


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with decoupled weight decay and clipping by global gradient norm."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # 0 turns clipping off


@dataclass(frozen=True)
class ScheduleConfig:
    """Learning-rate schedule: linear warmup, then decay to min_lr by lr_decay_iters."""

    warmup_iters: int = 0
    decay: str = "cosine"
    lr_decay_iters: int | None = None  # None resolves to train.max_iters
    min_lr: float = 0.0


@dataclass(frozen=True)
class TrainConfig:
    """The loop: batch shape, length, cadence of eval/log/checkpoint/sample, failure policy."""

    batch_size: int = 8
    grad_accum: int = 1
    max_iters: int = 1000
    eval_interval: int = 100  # 0: only at the end
    eval_iters: int = 10
    log_interval: int = 10
    ckpt_interval: int = 200  # 0: only at the end
    keep_ckpts: int = 3
    seed: int = 1337
    nan_policy: str = "skip"
    spike_threshold: float | None = None  # grad norm above this skips the step
    sample_interval: int = 0  # 0: only at the end
    sample_tokens: int = 100
    replay: bool = True  # capture the training step once and replay it (false: record every step; debugging)
    checkpoint_activations: str = "none"  # "block": recompute each block's forward in backward (less memory)
    init_from: str | None = None  # a run, checkpoint or Hugging Face directory to start from (fine-tuning)
    init_strict: bool = True  # false: load the parameters that match, list the rest (init_from only)
    init_tokenizer: str | None = None  # the tokenizer.json for init_from's weights (a source without its own)
    keep_best: bool = False  # also keep ckpt-best: the checkpoint of the lowest val loss (never rotated out)
    early_stop_patience: int = 0  # stop after this many evals without a lower val loss (0: never)
    watchdog_s: float = 600.0  # --nproc: end the job when a rank makes no progress for this long (0: never)
    tune: str = "off"  # "auto": before step 1, tune the kernel choices at this config's shapes where none are stored


@dataclass(frozen=True)
class RunConfig:
    """Where the run lives: out_dir/name."""

    out_dir: str = "runs"
    name: str | None = None  # None resolves to the config file's stem

    @property
    def dir(self) -> Path:
        """The run directory."""
        return Path(self.out_dir) / (self.name or "run")


@dataclass(frozen=True)
class TelemetryConfig:
    """Extra telemetry beside metrics.jsonl."""

    tensorboard: bool = False  # also write TensorBoard event files into the run directory


@dataclass(frozen=True)
class Config:
    """A whole, validated training configuration."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain JSON-able form (tuples become lists); `config_from_dict` reads it back."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


SECTIONS: dict[str, type] = {
    "model": ModelConfig, "data": DataConfig, "optim": OptimConfig,
    "schedule": ScheduleConfig, "train": TrainConfig, "run": RunConfig,
    "telemetry": TelemetryConfig,
}

_Rule = tuple[Callable[[Any], bool], str]
_pos: _Rule = (lambda v: v > 0, "a positive number")
_nonneg: _Rule = (lambda v: v >= 0, "zero or more")
_fraction: _Rule = (lambda v: 0 <= v < 1, "a number in [0, 1)")


def _upto(cap: float, low: float = 1, words: str = "") -> _Rule:
    """A number from `low` to `cap`: every numeric key has an upper bound, so a typo'd 10000000 is one line
    here instead of a hang or gigabytes of host memory later (device and data bounds are checked later)."""
    return (lambda v: low <= v <= cap, f"{'a positive number' if low > 0 else 'zero or more'}, at most {cap:,}"
            + (f" ({words})" if words else ""))


MAX_EVAL_ITERS = 100_000  # and at most the batches that cover the val split (trainer.loop.check_data_fit)
_ITERS = 10**9  # steps and intervals: far past any run, small enough that nothing sized by it is allocated
_name_re = re.compile(r"^[A-Za-z0-9_.\-]+$")

# Per-key value rules; cross-key rules live in _check_relations.
RULES: dict[tuple[str, str], _Rule] = {
    ("model", "arch"): (lambda v: v in ("gpt2", "llama"), 'one of "gpt2", "llama"'),
    ("model", "n_layer"): _upto(1024), ("model", "n_head"): _upto(1024), ("model", "n_embd"): _upto(65536),
    ("model", "n_kv_head"): _upto(1024), ("model", "block_size"): _upto(1 << 20),
    ("model", "vocab_size"): (lambda v: 257 <= v <= 2**32 - 1, "an integer from 257 (256 bytes + end-of-text) up"),
    ("model", "dropout"): _fraction, ("model", "softcap"): _upto(1e6, 0),
    ("model", "rope_base"): (lambda v: 0 < v <= 1e12, "a positive number, at most 1e12"),
    ("model", "norm_eps"): (lambda v: 0 < v <= 1, "a positive number, at most 1"),
    ("model", "dtype"): (lambda v: v in MODEL_DTYPES, "one of " + ", ".join(f'"{d}"' for d in MODEL_DTYPES)),
    ("data", "tokenizer"): (lambda v: v == "bpe", '"bpe" (byte-level BPE trained on the training split)'),
    ("data", "dataset"): (lambda v: v in NAMED_DATASETS,
                          " or ".join(f'"{n}"' for n in NAMED_DATASETS) + ' (or use path = "FILE.txt")'),
    ("data", "path"): (lambda v: "" not in ((v,) if isinstance(v, str) else v),
                       "a UTF-8 text file, a .jsonl file, a folder of them, or a list of these"),
    ("data", "text_field"): (lambda v: v != "", "the name of the .jsonl records' text field"),
    ("data", "val_fraction"): (lambda v: 0 < v < 1, "a number strictly between 0 and 1"),
    ("data", "root"): (lambda v: v != "", "a directory path"),
    # No cap: a learning rate costs no memory or time, and a huge one is how users (and tests) provoke a NaN.
    ("optim", "lr"): (lambda v: 0 < v < math.inf, "a positive finite number"),
    ("optim", "eps"): (lambda v: 0 < v <= 1, "a positive number, at most 1"),
    ("optim", "weight_decay"): _upto(100, 0), ("optim", "grad_clip"): _upto(1e9, 0),
    ("optim", "betas"): (lambda v: all(0 <= b < 1 for b in v), "two numbers in [0, 1), e.g. [0.9, 0.95]"),
    ("schedule", "warmup_iters"): _upto(_ITERS, 0), ("schedule", "lr_decay_iters"): _upto(_ITERS),
    ("schedule", "min_lr"): _nonneg,
    ("schedule", "decay"): (lambda v: v in ("cosine", "linear", "constant"), 'one of "cosine", "linear", "constant"'),
    ("train", "batch_size"): _upto(1 << 20), ("train", "grad_accum"): _upto(1 << 16, words="and at most the "
                                                                               "train split's windows per step"),
    ("train", "max_iters"): _upto(_ITERS), ("train", "eval_interval"): _upto(_ITERS, 0),
    ("train", "eval_iters"): _upto(MAX_EVAL_ITERS, words="and at most the batches that cover the val split"),
    ("train", "log_interval"): _upto(_ITERS), ("train", "ckpt_interval"): _upto(_ITERS, 0),
    ("train", "keep_ckpts"): _upto(10_000), ("train", "seed"): _upto(2**32 - 1, 0),
    ("train", "nan_policy"): (lambda v: v in ("skip", "stop"), 'one of "skip", "stop"'),
    ("train", "spike_threshold"): _pos, ("train", "sample_interval"): _upto(_ITERS, 0),
    ("train", "sample_tokens"): _upto(100_000, 0),
    ("train", "checkpoint_activations"): (lambda v: v in ("none", "block"), 'one of "none", "block"'),
    ("train", "init_tokenizer"): (lambda v: v != "", "a path to a tokenizer.json file"),
    ("train", "early_stop_patience"): _upto(1_000_000, 0),
    ("train", "watchdog_s"): _upto(7 * 86400, 0),
    ("train", "tune"): (lambda v: v in ("off", "auto"), 'one of "off", "auto"'),
    ("run", "out_dir"): (lambda v: v != "", "a directory path"),
    ("run", "name"): (lambda v: bool(_name_re.match(v)) and v.strip(".") != "",
                      "letters, digits, '_', '-', '.' (no slashes, not only dots)"),
}


def _fmt(value: Any) -> str:
    """A value as it would appear in TOML (strings quoted), for error messages."""
    return json.dumps(value) if isinstance(value, (str, list, tuple, bool)) else repr(value)


def _coerce(section: str, key: str, hint: Any, value: Any, source: str) -> Any:
    """Check `value` against the field's type hint, returning it in canonical form or raising ConfigError."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        # str | tuple[str, ...] (data.path): a list takes the tuple form, anything else the first.
        inner = next((a for a in options if typing.get_origin(a) is tuple and isinstance(value, list)), options[0])
        # TOML has no null; "none" (from the CLI or a file) restores an optional key's default meaning.
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and inner is not str):
            return None
        return _coerce(section, key, inner, value, source)
    where = f"{source}: [{section}] {key} = {_fmt(value)}"
    if value is None:  # only a command-line `none` gets here: TOML has no null
        raise ConfigError(f"{source}: [{section}] {key} = none is not allowed: `none` resets only an optional key; "
                          "give a value")
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} has the wrong type ({type(value).__name__}): expected true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where} has the wrong type ({type(value).__name__}): expected an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{where} is not allowed: expected a finite number")
            return float(value)
        raise ConfigError(f"{where} has the wrong type ({type(value).__name__}): expected a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where} has the wrong type ({type(value).__name__}): expected a string")
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:  # a list of any length but zero
            if isinstance(value, (list, tuple)) and value:
                return tuple(_coerce(section, key, args[0], v, source) for v in value)
            raise ConfigError(f"{where} is not allowed: expected a list of at least one string")
        if isinstance(value, (list, tuple)) and len(value) == len(args):
            return tuple(_coerce(section, key, a, v, source) for a, v in zip(args, value, strict=True))
        raise ConfigError(f"{where} has the wrong type: expected a list of {len(args)} numbers")
    raise AssertionError(f"unsupported config type {hint!r}")  # a programming error, not a user one


def _build_section(section: str, raw: Any, source: str) -> Any:
    """One section's dataclass from its TOML table, checking keys, types and per-key rules."""
    cls = SECTIONS[section]
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: [{section}] must be a table of keys, got {_fmt(raw)}")
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in raw.items():
        if key not in hints:
            raise ConfigError(f"{source}: unknown key '{key}' in [{section}]; valid keys: {', '.join(valid)}")
        value = _coerce(section, key, hints[key], value, source)
        rule = RULES.get((section, key))
        if rule is not None and value is not None and not rule[0](value):
            raise ConfigError(f"{source}: [{section}] {key} = {_fmt(value)} is not allowed: expected {rule[1]}")
        values[key] = value
    return cls(**values)


def _check_relations(cfg: Config, source: str) -> Config:
    """Cross-key rules; also resolves the keys whose default depends on another key."""
    m, d, s, t = cfg.model, cfg.data, cfg.schedule, cfg.train

    def bad(where: str, value: Any, allowed: str) -> ConfigError:
        return ConfigError(f"{source}: {where} = {_fmt(value)} is not allowed: {allowed}")

    if m.n_kv_head is None:
        m = dataclasses.replace(m, n_kv_head=m.n_head)
    fits = [h for h in range(1, m.n_embd + 1) if m.n_embd % h == 0 and (m.n_embd // h) % 4 == 0
            and m.n_embd // h <= 256]
    hint = f"n_head in {fits[:8]}" if fits else "an n_embd that is a multiple of 4"
    # The key named is the one to change: n_embd when no head count fits it (the head dim must be a multiple of 4),
    # else n_head (an `--model.n_head=3` on a 128-wide model is about n_head, not n_embd).
    if m.n_embd % m.n_head:
        if not fits:
            raise bad("[model] n_embd", m.n_embd, f"must be divisible by n_head ({m.n_head})")
        raise bad("[model] n_head", m.n_head, f"must divide n_embd ({m.n_embd}); with n_embd = {m.n_embd} use {hint}")
    if m.n_head % m.n_kv_head:
        raise bad("[model] n_head", m.n_head, f"must be divisible by n_kv_head ({m.n_kv_head})")
    if m.arch == "llama" and m.head_dim % 2:
        where, value = ("[model] n_head", m.n_head) if fits else ("[model] n_embd", m.n_embd)
        raise bad(where, value, f"llama RoPE needs an even head dim; n_embd/n_head = {m.head_dim}"
                  + (f"; with n_embd = {m.n_embd} use {hint}" if fits else ""))
    if m.head_dim % 4 or m.head_dim > 256:
        raise bad("[model] n_head", m.n_head, f"flash attention needs a head dim (n_embd/n_head = {m.head_dim}) that "
                  f"is a multiple of 4 and at most 256; with n_embd = {m.n_embd} use {hint}")
    if d.dataset is not None and d.path is not None:
        raise bad("[data] path", d.path, "set either dataset or path, not both")
    if d.dataset is None and d.path is None:
        d = dataclasses.replace(d, dataset="shakespeare")
    defaulted = s.lr_decay_iters is None
    if defaulted:
        s = dataclasses.replace(s, lr_decay_iters=t.max_iters)
    # A warmup longer than the run (lr_decay_iters left to default to max_iters) is not an error: the schedule
    # warms up over the whole run instead (trainer.schedule.warmup_warning says so), as nanoGPT and HF do. A run's
    # resolved.json spells the default out (lr_decay_iters = max_iters): the same schedule, so accepted too.
    if s.lr_decay_iters < s.warmup_iters and not defaulted and s.lr_decay_iters != t.max_iters:
        raise bad("[schedule] lr_decay_iters", s.lr_decay_iters, f"must be at least warmup_iters ({s.warmup_iters})")
    if s.min_lr > cfg.optim.lr:
        raise bad("[schedule] min_lr", s.min_lr, f"must not exceed optim.lr ({cfg.optim.lr})")
    if t.init_tokenizer is not None and t.init_from is None:
        raise bad("[train] init_tokenizer", t.init_tokenizer, "it is the tokenizer of [train] init_from's weights; "
                  "set init_from too")
    return dataclasses.replace(cfg, model=m, data=d, schedule=s)


def config_from_dict(raw: Mapping[str, Any], source: str = "config", default_name: str | None = None) -> Config:
    """Validate a parsed TOML/JSON document into a Config (raises ConfigError)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a table of sections, got {_fmt(raw)}")
    sections = {}
    for name, table in raw.items():
        if name not in SECTIONS:
            hint = "" if isinstance(table, Mapping) else f" (top-level key '{name}' must sit inside a section)"
            raise ConfigError(f"{source}: unknown section [{name}]{hint}; valid sections: {', '.join(SECTIONS)}")
        sections[name] = _build_section(name, table, source)
    cfg = Config(**sections)
    if cfg.run.name is None:
        name = re.sub(r"[^A-Za-z0-9_.\-]", "_", default_name or "run")
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, name=name))
    return _check_relations(cfg, source)


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value); the value is read as TOML, else taken as a bare string."""
    match = re.fullmatch(r"([A-Za-z_][\w-]*)\.([A-Za-z_][\w-]*)=(.*)", text, flags=re.S)
    if not match:
        raise ConfigError(f"override '--{text}' is not allowed: expected --section.key=value, "
                          "e.g. --train.max_iters=50")
    section, key, raw = match.groups()
    if raw.strip().lower() in ("none", "null"):
        return section, key, None  # the bare word resets an optional key (TOML itself has no null)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # lets --run.name=foo work without shell-quoting TOML strings
    return section, key, value


# Keys of which a config sets at most one: one given on the command line replaces the file's other.
EXCLUSIVE_KEYS = {("data", "path"): "dataset", ("data", "dataset"): "path"}


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of the parsed document with each `section.key=value` override set."""
    merged = {k: dict(v) if isinstance(v, Mapping) else v for k, v in raw.items()}
    given = set()
    for text in overrides:
        section, key, value = parse_override(text)
        table = merged.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"override '--{text}': '{section}' is not a section")
        table[key] = value
        given.add((section, key))
    for (section, key), rival in EXCLUSIVE_KEYS.items():
        if (section, key) in given and (section, rival) not in given and merged[section][key] is not None:
            merged[section].pop(rival, None)
    return merged


# Paths a config file names are relative to the file (so a run resumes, and finds its data, from any working
# directory); paths given as command-line overrides are relative to the working directory.
FILE_RELATIVE_PATHS = (("data", "path"), ("data", "root"), ("data", "cache_dir"), ("run", "out_dir"),
                       ("train", "init_from"), ("train", "init_tokenizer"))


def _anchor_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in raw.items()}
    for section, key in FILE_RELATIVE_PATHS:
        table = out.get(section)
        value = table.get(key) if isinstance(table, dict) else None
        if value is not None:
            table[key] = _anchored(value, lambda v: str(base / v))
    return out


def _anchored(value: Any, anchor: Callable[[str], str]) -> Any:
    """A relative path string (or each in a list: data.path) made absolute by anchor; anything else as it is."""
    if isinstance(value, list):
        return [_anchored(v, anchor) for v in value]
    if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
        return anchor(value)
    return value


def load_config_text(text: str, source: str = "config", overrides: Sequence[str] = (),
                     default_name: str | None = None, base_dir: Path | None = None) -> Config:
    """Parse TOML text (plus CLI overrides) into a validated Config; `base_dir` anchors relative paths."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message carries "(at line L, column C)".
        raise ConfigError(f"{source}: malformed TOML: {exc}") from None
    if base_dir is not None:
        raw = _anchor_paths(raw, base_dir)
    return config_from_dict(_anchor_typed_paths(apply_overrides(raw, overrides), overrides), source, default_name)


# Data paths typed on the command line are relative to the working directory of that command; they are stored
# absolute (resolved.json, checkpoints), so the run resumes and `eval --split train` finds its text from anywhere.
CWD_RELATIVE_OVERRIDES = (("data", "path"), ("data", "root"), ("data", "cache_dir"))


def _anchor_typed_paths(merged: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    typed = {parse_override(text)[:2] for text in overrides}
    for section, key in CWD_RELATIVE_OVERRIDES:
        table = merged.get(section)
        value = table.get(key) if (section, key) in typed and isinstance(table, dict) else None
        if value is not None:
            table[key] = _anchored(value, os.path.abspath)
    return merged


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    """Read a TOML file (None: all defaults) plus overrides into a validated Config."""
    if path is None:
        return load_config_text("", "defaults", overrides)
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None
    return load_config_text(text, str(path), overrides, default_name=path.stem, base_dir=path.resolve().parent)


def model_signature(model: ModelConfig) -> dict[str, Any]:
    """The model keys that must match between a checkpoint and the run loading it (dropout may differ)."""
    d = dataclasses.asdict(model)
    d.pop("dropout")
    return d
