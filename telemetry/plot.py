"""`python -m telemetry plot RUN_DIR`: one PNG with loss, lr, grad norm, throughput, memory and step time."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _series(events: list[dict[str, Any]], kind: str, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of events of one kind where the value is a number."""
    xs, ys = [], []
    for e in events:
        v = e.get(key)
        if e["event"] == kind and isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(e.get("step", len(xs)))
            ys.append(float(v))
    return xs, ys


def _plain_number(value: float, _pos: Any = None) -> str:
    """Tick label as a plain number (0.5, 2, 30), not 10^x: grad norms sit within a decade or two."""
    return f"{value:g}"


TRAIN_COLOR, VAL_COLOR = "tab:blue", "tab:orange"  # val on top in its own colour: never hidden under train


def resume_steps(events: list[dict[str, Any]]) -> list[int]:
    """Steps where the run was resumed (a `config` event with start_step > 0)."""
    return [e["start_step"] for e in events if e["event"] == "config" and isinstance(e.get("start_step"), int)
            and e["start_step"] > 0]


def memory_note(events: list[dict[str, Any]]) -> str:
    """Why the memory panel is empty, without guessing a backend the log does not name."""
    if not any(e["event"] == "step" for e in events):
        return "no steps logged"
    backend = next((e.get("backend") for e in reversed(events) if e["event"] == "config" and e.get("backend")), None)
    return "no device memory counters" + (f"\n({backend} backend)" if backend else "")


def build_figure(events: list[dict[str, Any]], title: str = "") -> Any:
    """The dashboard as a matplotlib Figure (Agg backend): 2x3 panels, resume points dotted on each."""
    import matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    fig.suptitle(title or "helios run")
    ax = axes[0, 0]
    ax.plot(*_series(events, "step", "loss"), lw=0.8, color=TRAIN_COLOR, label="train loss")
    ax.plot(*_series(events, "eval", "val_loss"), "o-", ms=3, color=VAL_COLOR, label="val loss", zorder=3)
    ax.set(title="loss", xlabel="step")
    ax.legend(loc="upper right")
    ax = axes[0, 1]
    ax.plot(*_series(events, "step", "lr"), color="tab:green")
    ax.set(title="learning rate", xlabel="step")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax = axes[0, 2]
    xs, ys = _series(events, "step", "grad_norm")
    ax.plot(xs, ys, lw=0.8, color="tab:purple", label="grad norm")
    clip = [(e["step"], e["grad_norm"]) for e in events if e["event"] == "step" and isinstance(e.get("clip_coef"),
            (int, float)) and e["clip_coef"] < 1 and isinstance(e.get("grad_norm"), (int, float))]
    if clip:
        ax.scatter(*zip(*clip, strict=True), s=6, color="tab:orange", label="clipped", zorder=3)
    for i, e in enumerate(e for e in events if e["event"] == "skip"):
        ax.axvline(e.get("step", 0), color="tab:red", lw=0.8, ls="--", label="skipped" if i == 0 else None)
    if ys and min(ys) > 0:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
        # Within about a decade the log axis has no major tick inside the data: label the minor ones plainly.
        few_decades = max(ys) / min(ys) < 30
        ax.yaxis.set_minor_formatter(FuncFormatter(_plain_number) if few_decades else NullFormatter())
    ax.set(title="gradient norm", xlabel="step")
    ax.legend(fontsize="small")
    ax = axes[1, 0]
    ax.plot(*_series(events, "step", "tok_per_s"), lw=0.8, color="tab:blue")
    ax.set(title="throughput (tokens/s)", xlabel="step")
    ax = axes[1, 1]
    xs, ys = _series(events, "step", "pool_bytes")
    if any(ys):
        ax.plot(xs, [y / 2**20 for y in ys], color="tab:brown", label="pool reserved")
        px, py = _series(events, "step", "pool_peak_in_use")
        if any(py):
            ax.plot(px, [y / 2**20 for y in py], color="tab:olive", label="peak in use")
        ax.legend(loc="upper left", fontsize="small")
    else:
        ax.text(0.5, 0.5, memory_note(events), ha="center", va="center", transform=ax.transAxes)
    ax.set(title="device memory (MiB)", xlabel="step")
    ax = axes[1, 2]
    for key in ("fwd_ms", "bwd_ms", "opt_ms", "wait_ms", "comm_ms"):  # comm_ms: data-parallel runs only
        if key != "comm_ms" or any(_series(events, "step", key)[1]):
            ax.plot(*_series(events, "step", key), lw=0.8, label=key[:-3])
    ax.set(title="step time (ms)", xlabel="step")
    ax.legend(fontsize="small")
    resumes = resume_steps(events)
    for ax in axes.flat:
        for i, step in enumerate(resumes):
            ax.axvline(step, color="0.4", lw=0.8, ls=":", label="resumed" if i == 0 else None)
    if resumes:
        axes[0, 0].legend()
    return fig


def plot_run(events: list[dict[str, Any]], out: Path, title: str = "") -> Path:
    """Render the dashboard figure to out (PNG); returns out.

    The image is rendered in memory and then written in one go, so an unwritable path raises OSError before
    any file is touched and a failed write leaves no partial PNG.
    """
    import io

    import matplotlib.pyplot as plt

    fig = build_figure(events, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_bytes(buf.getvalue())
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
