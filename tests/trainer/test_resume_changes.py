"""trainer/resume.py's decisions, without a backend: which batch a resume on another rank count trains with,
when it refuses, and which changes it warns about (the CLI-level tests: test_distributed, test_resume)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.checkpoint import Checkpoint
from trainer.config import load_config_text
from trainer.errors import CheckpointError
from trainer.resume import SavedBatch, fit_to_ranks, resume_warnings


def _cfg(batch_size: int = 4, **schedule):
    lines = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in schedule.items())
    return load_config_text(f"[train]\nbatch_size = {batch_size}\nmax_iters = 20\n[schedule]\n{lines}")


def _ckpt(ranks: int, batch_size: int, step: int = 6) -> Checkpoint:
    return Checkpoint(Path("ckpt-6"), step, {}, {"world_size": ranks, "config": _cfg(batch_size).to_dict()})


@pytest.mark.parametrize("saved_ranks,saved_batch,ranks,config_batch,trained", [
    (2, 4, 2, 4, 4),  # same ranks: as configured
    (2, 4, 1, 4, 8),  # fewer ranks: each takes more rows of the same global batch
    (1, 8, 4, 8, 2),  # more ranks: fewer rows each
    (2, 4, 1, 8, 8),  # a batch_size that already keeps the global batch
    (2, 4, 4, 3, 3),  # a new batch_size on purpose: kept (and warned about)
])
def test_the_global_batch_is_kept_over_another_rank_count(saved_ranks, saved_batch, ranks, config_batch, trained):
    cfg, notes = fit_to_ranks(_cfg(config_batch), SavedBatch(saved_ranks, saved_batch), ranks, "ckpt-6")
    assert cfg.train.batch_size == trained
    assert bool(notes) == (ranks != saved_ranks and trained * ranks == saved_ranks * saved_batch)


def test_a_global_batch_the_ranks_cannot_split_is_refused_naming_the_counts_that_work():
    with pytest.raises(CheckpointError) as caught:
        fit_to_ranks(_cfg(6), SavedBatch(2, 6), 5, "ckpt-6")
    assert "global batch of 12 rows (2 ranks x batch_size 6), which 5 ranks cannot split evenly" in str(caught.value)
    assert "--nproc 1, 2, 3, 4, 6 or 12" in str(caught.value)


def test_a_changed_global_batch_and_each_schedule_key_warn():
    cfg = _cfg(3, warmup_iters=2, decay="constant")
    lines = resume_warnings(cfg, _ckpt(2, 4), ranks=4)
    assert "with [train] batch_size = 3 on 4 ranks (it was trained with 2 ranks x batch_size 4): a global batch " \
           "of 12 rows instead of 8, so the data order changes" in "\n".join(lines)
    assert any("[schedule] warmup_iters = 2 (it was trained with 0)" in line for line in lines)
    assert any("[schedule] decay = constant (it was trained with cosine)" in line for line in lines)
    # cosine from 1e-3 to 0 over 20 steps, at step 6: 1e-3 * (1 + cos(0.3 pi)) / 2
    assert lines[-1] == ("trainer: note: the learning rate at step 6 is 0.001 "
                         "(the checkpoint's settings give 0.000793893)")
    assert resume_warnings(_cfg(4), _ckpt(2, 4), ranks=2) == []
