"""Bad input matrix: every case runs `python -m trainer run` in a subprocess and must end with exit code 2, one
line on stderr naming the problem and the fix, no traceback, and nothing the user had overwritten.

The finer-grained variants of most rows live in tests/trainer (test_config.py, test_data.py,
test_checkpoint.py, test_config_property.py); this matrix is the user's view of each, on the helios backend.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.reliability.conftest import TINY, child_env, snapshot, trainer_cli, write_config
from trainer.runlock import RunLock

TRAINED = {"train": {"max_iters": 4, "ckpt_interval": 2}}  # ckpt-2 and ckpt-4 (latest)
BPE = dict(TRAINED, model=dict(TINY["model"], vocab_size=300))
FAULTY = ("-m", "tests.reliability.faulty_trainer")


@dataclass
class Case:
    """A directory for one case: config writer, the prepared run, and what the CLI call needs."""

    root: Path
    corpus: Path
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    entry: tuple[str, ...] = ("-m", "trainer")

    @property
    def run_dir(self) -> Path:
        return self.root / "runs/tiny"

    def config(self, text: str | None = None, **sections: dict) -> Path:
        path = self.root / "cfg.toml"
        if text is not None:
            path.write_text(text, encoding="utf-8")
            return path
        return write_config(path, self.corpus, self.root / "runs", "tiny", **sections)

    def text_file(self, content: bytes) -> Path:
        path = self.root / "text.txt"
        path.write_bytes(content)
        return path

    def faults(self, spec: str) -> None:
        self.entry, self.env["RELIABILITY_FAULTS"] = FAULTY, spec


def flip_byte(path: Path, at: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[at] ^= 0xFF
    path.write_bytes(bytes(blob))


def hf_source(case: Case, config: dict | None = None, tokenizer: bool = True) -> Path:
    """The trained run (at case.run_dir) as a Hugging Face GPT-2 directory, config.json fields changed."""
    import json

    from safetensors.numpy import save_file

    from trainer.checkpoint import load_latest
    from trainer.config import load_config
    from trainer.export import hf_state

    model = load_config(case.config(**TRAINED)).model
    doc, weights = hf_state(model, load_latest(case.run_dir).tensors)
    out = case.root / "hf"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(doc | (config or {})))
    save_file(weights, str(out / "model.safetensors"))
    if tokenizer:
        shutil.copy(case.run_dir / "tokenizer.json", out / "tokenizer.json")
    return out


def tuned(case: Case, source: Path, **sections: dict) -> Path:
    """A config for a new run, runs/tuned, that starts from `source`."""
    train = dict(sections.pop("train", {}), init_from=str(source))
    return case.config(run={"name": "tuned"}, train=train, **sections)


def drop_latest(case: Case, damage: tuple[str, ...] = ()) -> None:
    (case.run_dir / "latest").unlink()
    for name in damage:
        flip_byte(case.run_dir / name / "model.safetensors", 200)


# Each setup gets a Case (with a trained run at case.run_dir when `trained`) and returns the config path.
@dataclass(frozen=True)
class Row:
    setup: Callable[[Case], Path]
    needles: tuple[str, ...]
    trained: bool | str = False  # True: a copy of `trained_run`; "bpe": of `trained_run_bpe`


ROWS: dict[str, Row] = {
    "malformed_toml": Row(lambda c: c.config("[train]\nmax_iters = = 3\n"), ("malformed TOML", "line 2, column")),
    "unknown_section": Row(lambda c: c.config("[modle]\nn_layer = 2\n"), ("[modle]", "valid sections", "model")),
    "unknown_key": Row(lambda c: c.config("[model]\nn_layers = 2\n"), ("n_layers", "valid keys", "n_layer")),
    "unknown_override": Row(lambda c: (c.args.append("--model.n_layerz=3"), c.config())[1],
                            ("n_layerz", "valid keys")),
    "wrong_type": Row(lambda c: c.config('[model]\nn_layer = "two"\n'), ("n_layer", '"two"', "integer")),
    "out_of_range": Row(lambda c: c.config("[optim]\nlr = -0.1\n"), ("lr", "-0.1", "positive")),
    "inconsistent_values": Row(lambda c: c.config("[model]\nn_embd = 130\nn_head = 4\n"),
                               ("n_embd", "130", "divisible by n_head (4)")),
    "missing_config": Row(lambda c: c.root / "nowhere.toml", ("cannot read config", "nowhere.toml")),
    "missing_data_file": Row(lambda c: c.config(data={"path": str(c.root / "gone.txt")}),
                             ("gone.txt", "does not exist")),
    "empty_data_file": Row(lambda c: c.config(data={"path": str(c.text_file(b" \n\n"))}), ("text.txt", "is empty")),
    "binary_data_file": Row(lambda c: c.config(data={"path": str(c.text_file(bytes(range(256)) * 64))}),
                            ("text.txt", "binary")),
    "text_too_short": Row(lambda c: c.config(data={"path": str(c.text_file(b"To be, or not to be.\n" * 4))},
                                             model={"block_size": 64}),
                          ("block_size = 64", "at most", "longer text or a smaller block")),
    # vocab 300, not the tiny model's 257: a byte-level vocabulary has no merges, so any text gives its tokenizer.
    "tokenizer_mismatch": Row(lambda c: c.config(data={"path": str(c.text_file(
        c.corpus.read_bytes().replace(b"king", b"duke")))}, **BPE), ("different tokenizer", "ckpt-4"),
        trained="bpe"),
    "model_config_mismatch": Row(lambda c: c.config(model={"n_embd": 32}, **TRAINED),
                                 ("different model config", "n_embd 16 -> 32", "ckpt-4"), trained=True),
    "truncated_safetensors": Row(lambda c: (c.run_dir.joinpath("ckpt-4/model.safetensors").write_bytes(
        c.run_dir.joinpath("ckpt-4/model.safetensors").read_bytes()[:-100]), c.config(**TRAINED))[1],
        ("ckpt-4/model.safetensors", "truncated"), trained=True),
    "corrupt_safetensors": Row(lambda c: (flip_byte(c.run_dir / "ckpt-4/model.safetensors", 200),
                                          c.config(**TRAINED))[1], ("ckpt-4/model.safetensors", "SHA-256"),
                               trained=True),
    "corrupt_state_json": Row(lambda c: (c.run_dir.joinpath("ckpt-4/state.json").write_text('{"step": '),
                                         c.config(**TRAINED))[1], ("ckpt-4/state.json", "corrupt"), trained=True),
    "dangling_latest": Row(lambda c: (c.run_dir.joinpath("latest").write_text("ckpt-9\n"), c.config(**TRAINED))[1],
                           ("ckpt-9, which does not exist",), trained=True),
    # Issue 38: keys fixed for a run's life, changed on a resume, were ignored silently.
    "resume_with_a_new_seed": Row(lambda c: (c.args.append("--train.seed=7"), c.config(**TRAINED))[1],
                                  ("resuming ckpt-4 with [train] seed = 7", "it was trained with seed",
                                   "new [run] name"), trained=True),
    "resume_with_a_new_init_from": Row(lambda c: (c.args.append(f"--train.init_from={c.root / 'other'}"),
                                                  c.config(**TRAINED))[1],
                                       ("resuming ckpt-4 with [train] init_from", "trained from scratch",
                                        "drop init_from"), trained=True),
    "resume_never": Row(lambda c: (c.args.extend(["--resume", "never"]), c.config(**TRAINED))[1],
                        ("already holds a run", "--resume auto"), trained=True),
    "run_dir_not_writable": Row(lambda c: c.config(run={"out_dir": str(c.text_file(b"a file") / "runs")}),
                                ("not writable", "[run] out_dir")),
    "bad_test_hook_value": Row(lambda c: (c.env.update(HELIOS_INJECT_NAN_STEPS="three"), c.config())[1],
                               ("HELIOS_INJECT_NAN_STEPS", "three")),
    # lr_decay_iters pinned to the trained run's: extending max_iters alone would also warn that the decay stretches
    "disk_full_during_checkpoint": Row(lambda c: (c.faults("enospc_after=0"), c.config(
        train={"max_iters": 6, "ckpt_interval": 2}, schedule={"lr_decay_iters": 4}))[1],
        ("could not write checkpoint ckpt-6", "the disk is full", "latest still points at ckpt-4"), trained=True),
    "disk_full_writing_val_tokens": Row(lambda c: (c.faults("val_enospc"), c.config())[1],
                                        ("cannot keep the tokenizer and validation tokens", "No space left")),
    "no_vulkan_driver": Row(lambda c: (c.env.update(VK_DRIVER_FILES="/nonexistent.json",
                                                    VK_ICD_FILENAMES="/nonexistent.json"), c.config())[1],
                            ("No Vulkan driver was found", "mesa-vulkan-drivers")),
    "no_timeline_semaphores": Row(lambda c: (c.faults("no_timeline"), c.config())[1],
                                  ("does not support timeline semaphores", "HELIOS_DEVICE")),
    # 8 layers x 512 wide: 25M parameters, 100 MB as one buffer (it binds), but parameters + gradients + Adam
    # moments need ~400 MB of a device that has 160 MiB.
    "out_of_device_memory": Row(lambda c: (c.faults("device_mb=160"), c.config(
        model={"n_layer": 8, "n_embd": 512, "n_head": 8}))[1],
        ("could not allocate", "bytes", "Pool state", "MiB reserved", "smaller batch size or model")),
    "model_exceeds_buffer_limit": Row(lambda c: c.config(model={"n_layer": 4, "n_embd": 4096, "n_head": 16}),
                                      ("parameters (", "MiB of fp32", "maxStorageBufferRange",
                                       "smaller [model] n_embd (4096)")),
    "memory_budget_not_a_number": Row(lambda c: (c.env.update(HELIOS_MEMORY_BUDGET_MB="abc"), c.config())[1],
                                      ("HELIOS_MEMORY_BUDGET_MB='abc'", "positive whole number of MiB")),
    "memory_budget_below_a_block": Row(lambda c: (c.env.update(HELIOS_MEMORY_BUDGET_MB="1"), c.config())[1],
                                       ("HELIOS_MEMORY_BUDGET_MB=1 is below one memory block", "use at least")),
    "validate_not_a_boolean": Row(lambda c: (c.env.update(HELIOS_VALIDATE="maybe"), c.config())[1],
                                  ("HELIOS_VALIDATE='maybe'", "1/true/yes/on", "0/false/no/off")),
    "device_index_out_of_range": Row(lambda c: (c.env.update(HELIOS_DEVICE="99"), c.config())[1],
                                     ("HELIOS_DEVICE=99 but only", "device(s) exist")),
    "init_from_missing": Row(lambda c: c.config(train={"init_from": str(c.root / "no-such-run")}),
                             ("[train] init_from", "does not exist", "Hugging Face model directory")),
    "init_from_fewer_layers": Row(lambda c: tuned(c, c.run_dir, model={"n_layer": 2}),
                                  ("[train] init_from", "n_layer 1 there, 2 here", "parameters the source lacks: h.1.*",
                                   "--train.init_strict=false"), trained=True),
    "init_from_other_heads_same_shapes": Row(lambda c: tuned(c, c.run_dir, model={"n_head": 4}),
                                             ("[train] init_from", "n_head 2 there, 4 here"), trained=True),
    "init_from_untied_head": Row(lambda c: tuned(c, c.run_dir, model={"tie_embeddings": False}),
                                 ("tie_embeddings true there, false here", "lm_head.weight"), trained=True),
    "init_from_hf_other_heads": Row(lambda c: tuned(c, hf_source(c, {"n_head": 4})), ("n_head 4 there, 2 here",),
                                    trained=True),
    "init_from_hf_relu": Row(lambda c: tuned(c, hf_source(c, {"activation_function": "relu"})),
                             ('activation "relu" there, "gelu_tanh" here',), trained=True),
    "init_from_hf_without_tokenizer": Row(lambda c: tuned(c, hf_source(c, tokenizer=False)),
                                          ("has no tokenizer.json", "--train.init_tokenizer="), trained=True),
    "init_tokenizer_missing": Row(lambda c: tuned(c, hf_source(c, tokenizer=False), train={
        "init_tokenizer": str(c.root / "no-tokenizer.json")}), ("[train] init_tokenizer", "is not a file"),
        trained=True),
    "init_tokenizer_without_init_from": Row(lambda c: c.config(train={"init_tokenizer": "tok.json"}),
                                            ("[train] init_tokenizer", "set init_from too")),
    "init_strict_not_a_bool": Row(lambda c: c.config(train={"init_strict": "maybe"}),
                                  ("[train] init_strict", "expected true or false")),
    "no_latest_and_no_checkpoint_verifies": Row(lambda c: (drop_latest(c, ("ckpt-2", "ckpt-4")),
                                                           c.config(**TRAINED))[1],
                                                ("no `latest` pointer", "none of its checkpoints verifies",
                                                 "ckpt-4", "new --run.name"), trained=True),
    "resume_never_without_latest": Row(lambda c: (drop_latest(c), c.args.extend(["--resume", "never"]),
                                                  c.config(**TRAINED))[2], ("already holds a run", "ckpt-4"),
                                       trained=True),
    "data_path_and_dataset_both_typed": Row(lambda c: (c.args.extend([f"--data.path={c.corpus}",
                                                                       "--data.dataset=shakespeare"]), c.config())[1],
                                            ("set either dataset or path, not both",)),
    "none_for_a_required_key": Row(lambda c: (c.args.append("--train.max_iters=none"), c.config())[1],
                                   ("[train] max_iters = none is not allowed", "give a value")),
    "nproc_zero": Row(lambda c: (c.args.extend(["--nproc", "0"]), c.config())[1], ("--nproc must be at least 1",)),
    # The --nproc launcher checks these before starting any rank: one line, not one per rank.
    "nproc_cannot_split_global_batch": Row(lambda c: (c.args.extend(["--nproc", "3"]), c.config(**TRAINED))[1],
                                           ("ckpt-4", "global batch of 2 rows (1 rank x batch_size 2)",
                                            "3 ranks cannot split evenly", "--nproc 1 or 2", "--train.batch_size=B"),
                                           trained=True),
    "nproc_with_a_bad_config": Row(lambda c: (c.args.extend(["--nproc", "2"]), c.config("[train]\nmax_iters = 0\n"))[1],
                                   ("max_iters", "positive")),
    "run_name_only_dots": Row(lambda c: c.config(run={"name": ".."}), ('[run] name = ".."', "not only dots")),
    "head_dim_not_multiple_of_4": Row(lambda c: c.config(model={"n_embd": 60, "n_head": 10}),
                                      ("[model] n_head = 10", "head dim (n_embd/n_head = 6)", "multiple of 4",
                                       "n_head in [1, 3, 5, 15]")),
    "head_dim_over_256": Row(lambda c: c.config(model={"n_embd": 520, "n_head": 2}),
                             ("[model] n_head = 2", "(n_embd/n_head = 260)", "at most 256")),
    # (Logits past the limit are chunked over rows; the MLP hidden layer is the widest activation left.)
    # Issue 38: a huge value is refused in one line before anything is sized by it (these hung or ate gigabytes).
    "huge_n_layer": Row(lambda c: (c.args.append("--model.n_layer=10000000"), c.config())[1],
                        ("[model] n_layer = 10000000", "at most 1,024")),
    "huge_grad_accum": Row(lambda c: (c.args.append("--train.grad_accum=100000000"), c.config())[1],
                           ("[train] grad_accum = 100000000", "at most 65,536")),
    "huge_eval_iters": Row(lambda c: (c.args.append("--train.eval_iters=100000000"), c.config())[1],
                           ("[train] eval_iters = 100000000", "at most 100,000")),
    "grad_accum_past_the_train_split": Row(lambda c: (c.args.append("--train.grad_accum=60000"), c.config())[1],
                                           ("[train] grad_accum = 60000", "train split's", "use at most")),
    "eval_iters_past_the_val_split": Row(lambda c: (c.args.append("--train.eval_iters=90000"), c.config())[1],
                                         ("[train] eval_iters = 90000", "val split's", "--eval-iters all")),
    "data_path_is_a_device": Row(lambda c: c.config(data={"path": "/dev/zero"}),
                                 ("/dev/zero is not a regular file", "character device")),
    "data_path_is_a_fifo": Row(lambda c: (os.mkfifo(c.root / "pipe"), c.config(data={"path": str(c.root / "pipe")}))[1],
                               ("pipe is not a regular file", "FIFO")),
    "batch_exceeds_buffer_limit": Row(lambda c: c.config(train={"batch_size": 200000}),
                                      ("micro-batch of 200000 x 8 tokens", "the MLP hidden layer",
                                       "batch_size <=")),
}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, corpus) -> Path:
    """A finished 4-step helios run (ckpt-2, ckpt-4) that the checkpoint cases copy and damage."""
    root = tmp_path_factory.mktemp("trained")
    cfg = write_config(root / "cfg.toml", corpus, root / "runs", "tiny", **TRAINED)
    done = trainer_cli("run", str(cfg), "--backend", "helios")
    assert done.returncode == 0, done.stderr
    return root / "runs/tiny"


@pytest.fixture(scope="module")
def trained_run_bpe(tmp_path_factory, corpus) -> Path:
    """The same with vocab 300, so its BPE tokenizer depends on the text."""
    root = tmp_path_factory.mktemp("trained-bpe")
    cfg = write_config(root / "cfg.toml", corpus, root / "runs", "tiny", **BPE)
    done = trainer_cli("run", str(cfg), "--backend", "helios")
    assert done.returncode == 0, done.stderr
    return root / "runs/tiny"


def _protected(case: Case, before: dict[str, str], after: dict[str, str], name: str) -> None:
    """Nothing overwritten: every file is as it was. A run that trained before failing (disk full) may append
    to its log and rewrite resolved.json, but its checkpoints and `latest` stay exactly as they were."""
    if case.run_dir.exists():  # a refused run leaves no directory holding only its lock file
        assert {p.name for p in case.run_dir.iterdir()} != {".lock"}, "a lock-only run directory was left"
    unchanged = {path: digest for path, digest in after.items() if path in before}
    created = sorted(path for path in after if path not in before and path.startswith("runs/"))
    if name == "disk_full_writing_val_tokens":  # what was written whole before the disk filled may stay
        assert unchanged == before and set(created) <= {"runs/tiny/resolved.json", "runs/tiny/tokenizer.json"}, created
        assert not [p for p in case.run_dir.iterdir() if p.name.startswith(".val_tokens")], "temp file left behind"
        return
    if name != "disk_full_during_checkpoint":
        assert unchanged == before and created == []  # new files elsewhere: only a data cache for a new text
        return
    rel = "runs/tiny/"
    for path, digest in before.items():
        if path.startswith(rel + "ckpt-") or path == rel + "latest":
            assert after.get(path) == digest, path
    old_log = (case.root / "before-metrics.jsonl").read_bytes()
    assert (case.run_dir / "metrics.jsonl").read_bytes().startswith(old_log)
    assert not [p for p in case.run_dir.iterdir() if p.name.startswith(".ckpt-")], "temp checkpoint left behind"


@pytest.mark.parametrize("name", sorted(ROWS))
def test_bad_input_is_one_clear_line_exit_2_and_changes_nothing(name, tmp_path, corpus, request):
    row = ROWS[name]
    case = Case(tmp_path, corpus)
    if row.trained:
        fixture = "trained_run_bpe" if row.trained == "bpe" else "trained_run"
        shutil.copytree(request.getfixturevalue(fixture), case.run_dir)
        shutil.copy(case.run_dir / "metrics.jsonl", tmp_path / "before-metrics.jsonl")
    cfg = row.setup(case)
    before = snapshot(tmp_path)
    proc = trainer_cli("run", str(cfg), "--backend", "helios", *case.args, entry=case.entry,
                       env=child_env(**case.env))
    err = proc.stderr.strip()
    print(f"[{name}] exit {proc.returncode}: {err}")  # `pytest -s` lists what users see (docs/RELIABILITY.md)
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr and err.count("\n") == 0, proc.stderr
    assert err.startswith("trainer: error: ")
    for needle in row.needles:
        assert needle in err, f"{needle!r} not in: {err}"
    _protected(case, before, snapshot(tmp_path), name)


@pytest.mark.parametrize("variable,value", [("HELIOS_DEVICE", "99"), ("HELIOS_MEMORY_BUDGET_MB", "abc"),
                                            ("HELIOS_VALIDATE", "maybe")])
def test_a_device_setting_error_leaves_no_run_directory(variable, value, tmp_path, corpus):
    case = Case(tmp_path, corpus)
    proc = trainer_cli("run", str(case.config()), "--backend", "helios", env=child_env(**{variable: value}))
    assert proc.returncode == 2 and not case.run_dir.exists() and not (tmp_path / "runs").exists()


def test_locked_run_dir_is_refused_and_the_holder_undisturbed(tmp_path, corpus, trained_run):
    # Two real trainer processes on one directory: tests/trainer/test_signals.py (the first goes on and finishes
    # bitwise equal to an uninterrupted run). Here the holder is this process; the refused run must not touch
    # anything, not even the lock file's pid.
    case = Case(tmp_path, corpus)
    shutil.copytree(trained_run, case.run_dir)
    cfg = case.config(**TRAINED)
    with RunLock(case.run_dir):
        holder = (case.run_dir / ".lock").read_text()
        before = snapshot(tmp_path)
        proc = trainer_cli("run", str(cfg), "--backend", "helios")
        assert (case.run_dir / ".lock").read_text() == holder == f"{os.getpid()}\n"
        assert snapshot(tmp_path) == before
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"in use by another trainer (pid {os.getpid()})" in proc.stderr and "SIGTERM" in proc.stderr


def test_the_matrix_covers_every_input_the_issue_names():
    named = {"malformed_toml", "unknown_section", "unknown_key", "wrong_type", "out_of_range", "missing_data_file",
             "empty_data_file", "binary_data_file", "text_too_short", "tokenizer_mismatch", "model_config_mismatch",
             "truncated_safetensors", "corrupt_safetensors", "run_dir_not_writable", "disk_full_during_checkpoint",
             "no_timeline_semaphores", "out_of_device_memory",
             # issue 28: init_from mismatches, a run directory without `latest`, data overrides
             "init_from_fewer_layers", "init_from_other_heads_same_shapes", "init_from_untied_head",
             "init_from_hf_other_heads", "init_from_hf_relu", "init_from_hf_without_tokenizer",
             "no_latest_and_no_checkpoint_verifies", "data_path_and_dataset_both_typed"}
    assert named <= set(ROWS)
    assert TINY["model"]["vocab_size"] == 257  # the needles above quote the tiny model's sizes
