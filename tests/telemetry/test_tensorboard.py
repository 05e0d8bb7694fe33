"""TensorBoard event files from trainer events, read back with tensorboard's own EventAccumulator."""

from __future__ import annotations

import pytest

from telemetry.tensorboard import TensorBoardSink

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402


def _config(start_step: int) -> dict:
    return {"event": "config", "t": 0.0, "start_step": start_step, "max_iters": 30, "backend": "helios",
            "config": {"model": {"n_layer": 2, "arch": "llama"}, "optim": {"lr": 1e-3, "betas": [0.9, 0.95]},
                       "train": {"spike_threshold": None}}}


def _step(i: int, loss: float) -> dict:
    return {"event": "step", "t": float(i), "step": i, "loss": loss, "lr": 1e-3, "grad_norm": 1.5, "clip_coef": 1.0,
            "skipped": None, "tok_per_s": 100.0 + i, "dispatches": 145, "mfu": None}


def _accumulate(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_scalars_text_and_hparams(tmp_path):
    forwarded = []
    sink = TensorBoardSink(tmp_path, forward=forwarded.append)
    sink(_config(0))
    for i in range(1, 11):
        sink(_step(i, 5.0 - i / 10))
    sink({"event": "skip", "t": 5.0, "step": 5, "reason": "nan"})
    sink({"event": "eval", "t": 10.0, "step": 10, "val_loss": 4.2})
    sink({"event": "sample", "t": 10.0, "step": 10, "prompt": "\n", "text": "To be or not"})
    sink({"event": "end", "t": 10.0, "step": 10, "status": "done"})
    sink.close()
    assert len(forwarded) == 15  # every record reaches the console listener too
    acc = _accumulate(tmp_path)
    scalars = acc.Tags()["scalars"]
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tok_per_s", "train/dispatches"):
        assert tag in scalars, tag
    assert "train/mfu" not in scalars  # None is not a number to chart
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 11))
    assert loss[-1].value == pytest.approx(4.0)
    assert [(e.step, e.value) for e in acc.Scalars("eval/val_loss")] == [(10, pytest.approx(4.2))]
    assert [e.step for e in acc.Scalars("train/skipped")] == [5]
    tensors = acc.Tags()["tensors"]
    assert any(t.startswith("samples") for t in tensors) and any(t.startswith("config") for t in tensors)
    sample = acc.Tensors(next(t for t in tensors if t.startswith("samples")))[0]
    assert b"To be or not" in sample.tensor_proto.string_val[0]
    # The config as hparams, in the run itself (not in a sub-run as tensorboardX's add_hparams would put it).
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hp = start.session_start_info.hparams
    assert hp["model.n_layer"].number_value == 2 and hp["model.arch"].string_value == "llama"
    assert hp["optim.betas"].string_value == "[0.9, 0.95]" and hp["train.spike_threshold"].string_value == "null"


def test_resume_appends_without_duplicating_steps(tmp_path):
    first = TensorBoardSink(tmp_path)
    first(_config(0))
    for i in range(1, 16):  # checkpointed at 10, then ran on to 15 before it was killed
        first(_step(i, 10.0 + i))
    first.close()
    resumed = TensorBoardSink(tmp_path)
    resumed(_config(10))
    for i in range(11, 21):
        resumed(_step(i, 100.0 + i))
    resumed.close()
    loss = _accumulate(tmp_path).Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 21))  # every step once
    assert [e.value for e in loss[10:]] == [100.0 + i for i in range(11, 21)]  # steps 11-15: the resumed copy
    assert [e.value for e in loss[:10]] == [10.0 + i for i in range(1, 11)]


def test_trainer_writes_event_files_when_configured_and_on_resume(tmp_path):
    """`--telemetry.tensorboard=true` end to end (torch backend, tiny model): a run and its resume, read back."""
    import json

    from tests.trainer.conftest import TINY, make_corpus, to_toml  # also sets the OpenMP mode before torch loads
    from trainer.cli import main as trainer_main

    corpus = tmp_path / "verse.txt"
    corpus.write_text(make_corpus(300), encoding="utf-8")
    doc = {k: dict(v) for k, v in TINY.items()}
    doc["data"] = {"path": str(corpus)}
    doc["run"] = {"out_dir": str(tmp_path / "runs"), "name": "tb"}
    doc["telemetry"] = {"tensorboard": True}
    cfg = tmp_path / "tb.toml"
    cfg.write_text(to_toml(doc), encoding="utf-8")
    assert trainer_main(["run", str(cfg), "--backend", "torch"]) == 0
    assert trainer_main(["run", str(cfg), "--backend", "torch", "--train.max_iters=12"]) == 0
    run = tmp_path / "runs" / "tb"
    assert len(list(run.glob("events.out.tfevents.*"))) == 2  # one file per process, in the run directory
    logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [(e["step"], e["loss"]) for e in logged if e["event"] == "step"]
    acc = _accumulate(run)
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(s, pytest.approx(v, rel=1e-6))
                                                                     for s, v in losses]
    assert [e.step for e in acc.Scalars("eval/val_loss")] == [4, 8, 12]
    assert json.loads((run / "resolved.json").read_text())["config"]["telemetry"] == {"tensorboard": True}
