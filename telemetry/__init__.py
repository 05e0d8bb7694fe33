"""Run telemetry: the metrics.jsonl event log, and tools that read it (watch, plot, summary)."""

from telemetry.events import MetricsWriter, read_events

__all__ = ["MetricsWriter", "read_events"]
