"""The metrics log: writer format, tolerant readers (truncated/malformed lines), incremental tailing."""

from __future__ import annotations

import json
import math

import pytest

from telemetry.events import EventTail, MetricsWriter, read_events


def test_writer_flushes_one_json_object_per_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsWriter(path) as w:
        w.emit("config", config={"a": 1})
        w.emit("step", step=1, loss=math.nan, grad_norm=math.inf, lr=1e-3)
        # Flushed per line: a reader sees both events before the writer is closed.
        lines = path.read_text().splitlines()
        assert len(lines) == 2
    step = json.loads(lines[1])
    assert step["event"] == "step" and isinstance(step["t"], float)
    assert step["loss"] is None and step["grad_norm"] is None  # NaN/Inf are not JSON
    assert [e["event"] for e in read_events(tmp_path)] == ["config", "step"]


def test_reader_skips_truncated_and_malformed_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = [json.dumps({"event": "step", "t": 1.0, "step": i, "loss": 2.0}) for i in range(3)]
    path.write_text("\n".join([good[0], "not json", '{"no": "event"}', "[1, 2]", good[1], "", good[2]])
                    + '\n{"event": "step", "t": 2.0, "st')
    with pytest.warns(UserWarning) as caught:
        events = read_events(path)
    assert [e["step"] for e in events] == [0, 1, 2]
    assert len(caught) == 4
    assert read_events(tmp_path / "missing") == []


def test_tail_waits_for_complete_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = EventTail(tmp_path)
    assert tail.poll() == []
    path.write_text('{"event": "a", "t": 1}\n{"event": "b", "t"')
    assert [e["event"] for e in tail.poll()] == ["a"]
    with open(path, "a") as f:
        f.write(': 2}\n{"event": "c", "t": 3}\n')
    assert [e["event"] for e in tail.poll()] == ["b", "c"]
    assert tail.poll() == []


def test_check_telemetry_tells_a_log_from_another_file(tmp_path):
    from telemetry.events import NotTelemetryError, check_telemetry

    cases = {
        "empty": ("", True),
        "config first": ('{"event": "config", "t": 1}\n{"event": "step", "t": 2, "step": 1}\n', True),
        "being written": ('{"event": "config", "t": 1, "conf', True),
        "torn first line, then events": ('{"event": "config", "t": 1, "co\n{"event": "config", "t": 2}\n', True),
        "text": ("hello\nworld\n", False),
        "json, not an event": ('{"a": 1}\n', False),
        "a json list": ("[1, 2, 3]\n", False),
        "csv": ("step,loss\n1,2.0\n", False),
    }
    for name, (text, ok) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(text)
        if ok:
            check_telemetry(path)
        else:
            with pytest.raises(NotTelemetryError, match="is not a helios metrics log"):
                check_telemetry(path)
    binary = tmp_path / "binary"
    binary.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(NotTelemetryError):
        check_telemetry(binary)
