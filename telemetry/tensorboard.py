"""TensorBoard event files beside metrics.jsonl (`[telemetry] tensorboard = true`).

`TensorBoardSink` is a trainer event listener: it receives each record the trainer logs and mirrors it into
RUN_DIR with tensorboardX (which needs neither TensorFlow nor torch), so `tensorboard --logdir runs` shows
every run. Numeric step fields become scalars `train/<field>`, evals `eval/val_loss`, skips `train/skipped`,
samples text `samples`, and the resolved config both text `config` and hparams.

Resume: a run resumed from its checkpoint at step N opens its writer with purge_step N+1. TensorBoard then
drops whatever an earlier process logged after N (steps it ran past its last checkpoint before it was stopped)
and the resumed process's steps take their place, so no step appears twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

FLUSH_SECS = 5  # a killed trainer loses at most this much of the TensorBoard view (metrics.jsonl has it all)
_NOT_SCALARS = {"step", "t"}


def _flat_hparams(config: dict[str, Any]) -> dict[str, Any]:
    """{"model.n_layer": 4, ...}: hparams take numbers, strings and booleans only."""
    flat: dict[str, Any] = {}
    for section, table in config.items():
        if not isinstance(table, dict):
            continue
        for key, value in table.items():
            if isinstance(value, (bool, int, float, str)):
                flat[f"{section}.{key}"] = value
            else:
                flat[f"{section}.{key}"] = json.dumps(value)  # None and lists as their JSON text
    return flat


class TensorBoardSink:
    """Writes trainer events as TensorBoard summaries; forwards each record to `forward` (e.g. the console)."""

    def __init__(self, run_dir: str | Path, forward: Callable[[dict], None] | None = None):
        self.run_dir = Path(run_dir)
        self.forward = forward
        self._writer: Any = None

    def __call__(self, record: dict[str, Any]) -> None:
        """Handle one event record (as the trainer's listener)."""
        self._write(record)
        if self.forward is not None:
            self.forward(record)

    def _open(self, start_step: int) -> Any:
        from tensorboardX import SummaryWriter

        if self._writer is not None:
            self._writer.close()
        # purge_step hides anything logged at steps > start_step by an earlier process (see module docstring);
        # the suffix keeps a resume within the same second from sharing a file name with the first process.
        self._writer = SummaryWriter(logdir=str(self.run_dir), purge_step=start_step + 1, flush_secs=FLUSH_SECS,
                                     filename_suffix=f".from{start_step}")
        return self._writer

    def _write(self, e: dict[str, Any]) -> None:
        event, step = e.get("event"), e.get("step")
        if event == "config":
            start = e.get("start_step") if isinstance(e.get("start_step"), int) else 0
            w = self._open(start)
            config = e.get("config") or {}
            w.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", global_step=start)
            self._add_hparams(w, config)
            return
        w = self._writer
        if w is None or not isinstance(step, int):
            return  # events before the run's config event carry nothing to chart
        if event == "step":
            for key, value in e.items():
                if key not in _NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    w.add_scalar(f"train/{key}", value, global_step=step)
        elif event == "eval" and isinstance(e.get("val_loss"), (int, float)):
            w.add_scalar("eval/val_loss", e["val_loss"], global_step=step)
        elif event == "skip":
            w.add_scalar("train/skipped", 1, global_step=step)
        elif event == "sample":
            w.add_text("samples", "```\n" + str(e.get("prompt", "")) + str(e.get("text", "")) + "\n```",
                       global_step=step)
        elif event in ("ckpt", "end"):
            w.flush()  # what a checkpoint keeps, TensorBoard shows

    @staticmethod
    def _add_hparams(w: Any, config: dict[str, Any]) -> None:
        """The config as this run's hparams (into the run itself, not a separate sub-run as add_hparams does)."""
        from tensorboardX.summary import hparams

        exp, ssi, sei = hparams(_flat_hparams(config), {"train/loss": None, "eval/val_loss": None})
        fw = w._get_file_writer()
        for summary in (exp, ssi, sei):
            fw.add_summary(summary)

    def close(self) -> None:
        """Flush and close the event file, then close the forwarded listener if it has close()."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        close = getattr(self.forward, "close", None)
        if callable(close):
            close()
