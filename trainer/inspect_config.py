"""`trainer config CONFIG [overrides]` and `trainer configs`: look before training.

`config` prints the resolved configuration (every default filled in, overrides applied) and the model's
size: parameters, training FLOPs per token, and the device memory the fixed part of training needs
(parameters, gradients and two AdamW moments in fp32: 16 bytes per parameter) plus the logits, the
largest activation. `configs` lists the shipped configs with the first sentence of each one's comment.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.backend import count_params, flops_per_token
from trainer.config import Config

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
MiB = 1 << 20


def model_size(cfg: Config) -> dict[str, float]:
    """Parameters, FLOPs per token and a memory floor of one training step, from the config alone."""
    m, t = cfg.model, cfg.train
    n = count_params(m)
    tokens = t.batch_size * m.block_size
    half = m.dtype in ("bf16", "fp16")  # "auto" is counted as fp32 (what it is on lavapipe) without a device
    return {"parameters": n, "flops_per_token": flops_per_token(m, n),
            "tokens_per_step": tokens * t.grad_accum,
            # fp32 parameters, gradients, AdamW m and v (+ the 16-bit working copy of mixed precision)
            "fixed_mib": (18 if half else 16) * n / MiB,
            "logits_mib": 2 * (2 if half else 4) * tokens * m.vocab_size / MiB}  # logits and their gradient


def precision(cfg: Config) -> tuple[str, str]:
    """(dtype the helios backend will train in, why): "auto" is decided on this machine's Vulkan device."""
    if cfg.model.dtype != "auto":
        return cfg.model.dtype, "model.dtype in the config"
    from autograd.nn.gpt import auto_dtype
    from helios.device import device_info
    from helios.errors import HeliosError

    try:
        dtype, why = auto_dtype(device_info())
        return dtype, f"auto: {why}"
    except HeliosError as exc:
        return "auto", f"decided on the device at run time; no Vulkan device here ({str(exc).splitlines()[0]})"


def mfu_peak() -> dict[str, float | str | None]:
    """The peak the helios backend's MFU divides by on this machine, and its source, without measuring:
    {"device", "peak_flops" (None until a run measures it), "source"}."""
    from helios.ceilings import peak
    from helios.device import device_info
    from helios.env import cache_dir
    from helios.errors import HeliosError

    try:
        name = device_info().name
    except HeliosError as exc:
        return {"device": None, "peak_flops": None, "source": f"no Vulkan device here ({str(exc).splitlines()[0]})"}
    known = peak.known_peak(name)
    if known is not None:
        return {"device": name, "peak_flops": known.flops, "source": known.source}
    return {"device": name, "peak_flops": None,
            "source": f"not measured yet: the first run measures the FMA kernel (about a second) and keeps the best "
                      f"in {cache_dir() / peak.LIMITS_FILE}"}


def describe(cfg: Config, as_json: bool = False) -> str:
    """The resolved config as TOML-like text (or one JSON object) followed by the model's size and the device
    peak that MFU is measured against."""
    size = model_size(cfg)
    dtype, why = precision(cfg)
    peak = mfu_peak()
    if as_json:
        return json.dumps({"config": cfg.to_dict(), "size": size, "dtype": dtype, "dtype_reason": why,
                           "mfu_peak": peak})
    lines = []
    for section, table in cfg.to_dict().items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
        lines.append("")
    lines += [f"# dtype             {dtype} ({why})",
              f"# parameters        {size['parameters']:,}",
              f"# FLOPs per token   {size['flops_per_token'] / 1e6:,.1f} M (training: forward + backward)",
              f"# tokens per step   {size['tokens_per_step']:,}",
              f"# device memory     >= {size['fixed_mib'] + size['logits_mib']:,.0f} MiB: {size['fixed_mib']:,.0f} "
              f"for parameters, gradients and AdamW state, {size['logits_mib']:,.0f} for the logits and their "
              f"gradient; other activations add to it (train.checkpoint_activations = \"block\" cuts them)",
              "# MFU peak          "
              + (f"{peak['peak_flops'] / 1e9:,.1f} GFLOP/s: " if peak["peak_flops"] else "")
              + f"{peak['source']}"]
    return "\n".join(lines)


def config_value(cfg: Config, key: str) -> str:
    """One resolved value as text, for scripts (`trainer config C --get run.dir`): strings bare, the rest as JSON;
    `run.dir` is the run directory (out_dir/name)."""
    from trainer.errors import ConfigError

    section, _, name = key.partition(".")
    table = cfg.to_dict()
    if section not in table:
        raise ConfigError(f"--get {key}: expected SECTION.KEY with a section among {', '.join(table)}")
    if (section, name) == ("run", "dir"):
        return str(cfg.run.dir.resolve())  # absolute, without the `configs/..` a file-relative out_dir gives
    if name not in table[section]:
        keys = [*table[section], *(["dir"] if section == "run" else [])]
        raise ConfigError(f"--get {key}: no key '{name}' in [{section}]; valid keys: {', '.join(keys)}")
    value = table[section][name]
    return value if isinstance(value, str) else json.dumps(value)


def shipped_configs(directory: Path = CONFIG_DIR) -> list[tuple[str, str]]:
    """(path, description) of each shipped config: the first sentence of the comment at the top of the file,
    however many lines it spans."""
    out = []
    for path in sorted(directory.glob("*.toml")):
        header = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            header.append(line.lstrip("#").strip())
        out.append((str(path.relative_to(directory.parent)), first_sentence(" ".join(header))))
    return out


def first_sentence(text: str) -> str:
    """Text up to the first full stop that ends a sentence: followed by a space or the end, outside
    parentheses and backquotes, and not inside a number such as 0.76."""
    depth, quoted = 0, False
    for i, ch in enumerate(text):
        if ch == "`":
            quoted = not quoted
        elif ch in "([" and not quoted:
            depth += 1
        elif ch in ")]" and not quoted:
            depth = max(0, depth - 1)
        elif ch == "." and depth == 0 and not quoted and (i + 1 == len(text) or text[i + 1] == " "):
            return text[: i + 1]
    return text


def format_configs(rows: list[tuple[str, str]], width: int | None = None) -> str:
    """One entry per config, the description beside the path; wrapped at whole words to `width` columns (a
    terminal's) under its own column, or left on one line each (None: for grep and pipes)."""
    import textwrap

    col = max((len(path) for path, _ in rows), default=0) + 2
    lines = []
    for path, about in rows:
        if width is None or width - col < 30:
            lines.append(f"{path:<{col}}{about}")
            continue
        wrapped = textwrap.wrap(about, width - col) or [""]
        lines.append(f"{path:<{col}}{wrapped[0]}")
        lines += [" " * col + more for more in wrapped[1:]]
    return "\n".join(lines)
