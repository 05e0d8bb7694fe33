"""Run telemetry: the metrics.jsonl event log, tools that read it (watch, plot, summary, the `serve` browser
dashboard) and an optional TensorBoard sink (telemetry.tensorboard)."""

from telemetry.events import MetricsWriter, read_events

__all__ = ["MetricsWriter", "read_events"]
