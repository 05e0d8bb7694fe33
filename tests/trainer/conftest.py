"""Fixtures for trainer tests: a small generated corpus and a tiny config that trains in milliseconds per step."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from trainer import env

env.prefer_passive_omp()  # before any test module imports torch (see trainer/env.py)

WORDS = ("the king queen lord lady sword crown night day love death blood heart speak hear good noble fair "
         "sweet thou thee thy art doth hath wherefore gentle brave honour grace war peace england france").split()


def make_corpus(n_lines: int = 1500, seed: int = 0) -> str:
    """Pseudo-verse from a small vocabulary: learnable, deterministic, no network."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        if i % 7 == 0:
            lines.append(rng.choice(["KING.", "QUEEN.", "LORD.", "LADY."]))
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + rng.choice(".,;!?"))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A ~45 KB text file; its tokenizer cache is shared by every test of the session."""
    path = tmp_path_factory.mktemp("corpus") / "verse.txt"
    path.write_text(make_corpus(), encoding="utf-8")
    return path


TINY = {
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 320},
    "optim": {"lr": 3e-3},
    "schedule": {"warmup_iters": 2},
    "train": {"batch_size": 4, "max_iters": 8, "eval_interval": 4, "eval_iters": 2, "log_interval": 2,
              "ckpt_interval": 4, "keep_ckpts": 2, "sample_tokens": 8, "seed": 7},
}


def parity_config(steps: int, eval_interval: int, log_interval: int) -> dict:
    """The loss-parity model and schedule (small enough for ~1 s of torch and ~10-20 s of helios on lavapipe per
    60 steps, big enough that the loss falls a lot), trained for `steps`."""
    return {
        "model": {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 32, "vocab_size": 320},
        "optim": {"lr": 3e-3},
        "schedule": {"warmup_iters": 5, "min_lr": 3e-4},
        "train": {"batch_size": 8, "max_iters": steps, "eval_interval": eval_interval, "eval_iters": 4,
                  "log_interval": log_interval, "ckpt_interval": 0, "sample_tokens": 0, "seed": 11},
    }


def toml_value(v) -> str:
    """A Python value as TOML."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def to_toml(doc: dict) -> str:
    """A two-level dict as TOML text."""
    out = []
    for section, table in doc.items():
        out.append(f"[{section}]")
        out += [f"{k} = {toml_value(v)}" for k, v in table.items()]
        out.append("")
    return "\n".join(out)


def write_config(root: Path, corpus: Path, name: str = "tiny", **sections) -> Path:
    """TINY updated by `sections`, written to root/<name>.toml, its run dir root/runs/<name>."""
    doc = {k: dict(v) for k, v in TINY.items()}
    doc["data"] = {"path": str(corpus)}
    doc["run"] = {"out_dir": str(root / "runs"), "name": name}
    for section, updates in sections.items():
        doc.setdefault(section, {}).update(updates)
    path = root / f"{name}.toml"
    path.write_text(to_toml(doc), encoding="utf-8")
    return path


@pytest.fixture
def make_config(tmp_path, corpus):
    """write(name="cfg", **section_updates) -> path of a tiny config whose run dir is tmp_path/runs/<name>."""
    def write(name: str = "tiny", **sections) -> Path:
        return write_config(tmp_path, corpus, name, **sections)
    return write


@pytest.fixture(scope="session")
def needs_mpiexec():
    """Skip a data-parallel test where no MPI launcher is installed (its message says what to install)."""
    from trainer.distributed import mpiexec

    try:
        mpiexec()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(str(exc))
