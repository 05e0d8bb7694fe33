"""Issue 38: the val-loss curve has its own colour and a legend entry, in `telemetry plot` and the live dashboard,
so it is never hidden under the train line."""

from __future__ import annotations

import json
import re
from pathlib import Path

from matplotlib.colors import to_rgba

from telemetry.plot import build_figure

DASHBOARD_JS = Path(__file__).resolve().parents[2] / "telemetry" / "web" / "dashboard.js"


def _events() -> list[dict]:
    steps = [{"event": "step", "t": i, "step": i, "loss": 3.0 - i / 10, "lr": 1e-3} for i in range(1, 11)]
    evals = [{"event": "eval", "t": i, "step": i, "val_loss": 3.1 - i / 10} for i in (5, 10)]
    return steps + evals


def test_plot_draws_val_loss_in_its_own_colour_with_a_legend():
    ax = build_figure(_events()).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    train, val = lines["train loss"], lines["val loss"]
    assert to_rgba(train.get_color()) != to_rgba(val.get_color())
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == ["train loss", "val loss"]


def _js_array(name: str, text: str) -> list[str]:
    return json.loads(re.search(rf"const {name} = (\[[^\]]*\]);", text).group(1))


def test_dashboard_val_loss_colour_differs_from_its_runs_train_colour():
    text = DASHBOARD_JS.read_text()
    train, val = _js_array("PALETTE", text), _js_array("VAL_PALETTE", text)
    assert len(val) == len(train) and all(a.lower() != b.lower() for a, b in zip(train, val, strict=True))
    loss_chart = text[text.index("function chartLoss"):text.index("function chartLr")]
    val_trace = loss_chart[loss_chart.index('"val_loss"'):]
    assert "r.valColor" in val_trace and "r.color" not in val_trace  # the val trace never takes the train colour
    assert "showlegend: true" in loss_chart and "val loss" in loss_chart
