"""Checkpoint reliability: full disk, corrupt files, mismatched tokenizer/model, unwritable or locked run dirs."""

from __future__ import annotations

import errno

import pytest
import torch  # noqa: F401  (a pinned test dependency: a missing torch is an error, not a skip)

from trainer import checkpoint
from trainer.checkpoint import latest_path, load_checkpoint
from trainer.cli import main
from trainer.errors import CheckpointError
from trainer.runlock import RunLock


def run(cfg, *extra):
    return main(["run", str(cfg), "--backend", "torch", *extra])


def test_disk_full_during_checkpoint_keeps_latest(make_config, tmp_path, monkeypatch, capsys):
    cfg = make_config()
    real = checkpoint._write_file
    calls = {"n": 0}

    def flaky(path, data):
        # The first checkpoint (2 files + pointer) succeeds; the second fails half-way through its tensor file.
        calls["n"] += 1
        if calls["n"] > 3:
            with open(path, "wb") as f:
                f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(checkpoint, "_write_file", flaky)
    assert run(cfg) == 2
    err = capsys.readouterr().err
    assert "disk is full" in err and "latest still points at ckpt-4" in err and "Traceback" not in err
    run_dir = tmp_path / "runs/tiny"
    assert latest_path(run_dir).name == "ckpt-4"
    assert load_checkpoint(run_dir / "ckpt-4").step == 4
    assert sorted(p.name for p in run_dir.iterdir() if "ckpt" in p.name) == ["ckpt-4"]  # no temp dir left
    monkeypatch.setattr(checkpoint, "_write_file", real)
    assert run(cfg) == 0  # the good checkpoint resumes
    assert "resumed from ckpt-4" in capsys.readouterr().out


def test_disk_full_while_updating_latest_keeps_old_pointer(make_config, tmp_path, monkeypatch):
    cfg = make_config()
    real = checkpoint._write_file

    def no_pointer(path, data):
        if path.name.startswith(".latest") and (tmp_path / "runs/tiny/latest").exists():
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(checkpoint, "_write_file", no_pointer)
    assert run(cfg) == 2
    assert latest_path(tmp_path / "runs/tiny").name == "ckpt-4"


@pytest.mark.parametrize("damage", ["truncate", "flip", "state"])
def test_corrupt_checkpoint_is_a_clear_error(make_config, tmp_path, capsys, damage):
    cfg = make_config()
    assert run(cfg) == 0
    ckpt = tmp_path / "runs/tiny/ckpt-8"
    model = ckpt / "model.safetensors"
    blob = model.read_bytes()
    if damage == "truncate":
        model.write_bytes(blob[: len(blob) - 100])
    elif damage == "flip":
        model.write_bytes(blob[:-10] + bytes([blob[-10] ^ 0xFF]) + blob[-9:])
    else:
        (ckpt / "state.json").write_text('{"format": 1, "step": ')
    with pytest.raises(CheckpointError, match="corrupt|truncated"):
        load_checkpoint(ckpt)
    capsys.readouterr()
    assert run(cfg, "--train.max_iters=12") == 2
    err = capsys.readouterr().err
    assert "ckpt-8" in err and ("corrupt" in err or "truncated" in err) and "Traceback" not in err
    assert model.parent.is_dir() and (tmp_path / "runs/tiny/latest").read_text().strip() == "ckpt-8"


def test_raw_safetensors_garbage_is_caught(tmp_path):
    import hashlib
    import json

    d = tmp_path / "ckpt-1"
    d.mkdir()
    blob = b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}"
    (d / "model.safetensors").write_bytes(blob)
    (d / "state.json").write_text(json.dumps({"format": 1, "step": 1, "model_file": {
        "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}}))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(d)


def test_different_model_config_is_refused(make_config, tmp_path, capsys):
    cfg = make_config()
    assert run(cfg) == 0
    before = (tmp_path / "runs/tiny/metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert run(cfg, "--model.n_layer=3", "--train.max_iters=12") == 2
    err = capsys.readouterr().err
    assert "different model config" in err and "n_layer 2 -> 3" in err
    assert (tmp_path / "runs/tiny/metrics.jsonl").read_bytes() == before  # nothing written
    assert (tmp_path / "runs/tiny/latest").read_text().strip() == "ckpt-8"


def test_different_tokenizer_is_refused(make_config, tmp_path, corpus, capsys):
    cfg = make_config()
    assert run(cfg) == 0
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text().replace("king", "duke"))
    capsys.readouterr()
    assert run(cfg, f"--data.path={other}", "--train.max_iters=12") == 2
    assert "different tokenizer" in capsys.readouterr().err


def test_unwritable_run_dir_is_a_clear_error(make_config, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert run(make_config(run={"out_dir": str(blocker / "runs")})) == 2
    err = capsys.readouterr().err
    assert "not writable" in err and "Traceback" not in err


def test_resume_never_refuses_an_existing_run(make_config, capsys):
    cfg = make_config()
    assert run(cfg) == 0
    capsys.readouterr()
    assert run(cfg, "--resume", "never") == 2
    assert "already holds a run" in capsys.readouterr().err


def test_locked_run_dir_is_refused_and_left_alone(make_config, tmp_path, capsys):
    cfg = make_config()
    run_dir = tmp_path / "runs/tiny"
    run_dir.mkdir(parents=True)
    with RunLock(run_dir):
        holder = (run_dir / ".lock").read_text()
        assert run(cfg) == 2
        assert (run_dir / ".lock").read_text() == holder
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]
    err = capsys.readouterr().err
    assert "in use by another trainer" in err and holder.strip() in err
    assert run(cfg) == 0  # free again once released


def test_corrupt_latest_pointer(make_config, tmp_path, capsys):
    cfg = make_config()
    assert run(cfg) == 0
    (tmp_path / "runs/tiny/latest").write_text("ckpt-99\n")
    capsys.readouterr()
    assert run(cfg) == 2
    assert "ckpt-99, which does not exist" in capsys.readouterr().err
