"""What a run directory keeps so that `sample` and `eval` need nothing else: the tokenizer and the validation
tokens, written by `trainer run` beside the checkpoints (and the tokenizer inside every checkpoint's state).

A run directory moved elsewhere, or whose training text was deleted or changed, still samples and evaluates.
The training split is not copied (it can be large): evaluating on it needs the data, and says so.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from trainer.errors import DataError, TrainerError
from trainer.tokens import PreparedData, load_tokenizer, sha256_bytes

TOKENIZER = "tokenizer.json"
VAL_TOKENS = "val_tokens.npy"


def _write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """write(file) into a temp file beside path, then rename it into place; the temp file is removed when
    anything fails (a full disk), and the file gets the mode the umask gives new files (not mkstemp's 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def save(run_dir: Path, data: PreparedData, step: int = 0) -> str | None:
    """Keep the run's tokenizer and validation tokens in its directory (rewritten only when they changed).
    Validation tokens that changed are never lost: the old file is kept as val_tokens.before-<step>.npy, whose
    name is returned (None when nothing was kept), so that the val curve before `step` can still be told apart."""
    kept = None
    try:
        tok = data.tokenizer_path.read_bytes()
        if not (run_dir / TOKENIZER).exists() or (run_dir / TOKENIZER).read_bytes() != tok:
            _write_atomic(run_dir / TOKENIZER, lambda f: f.write(tok))
        val = np.ascontiguousarray(data.val)
        path = run_dir / VAL_TOKENS
        if not path.exists() or not np.array_equal(read_val_tokens(path), val):
            if path.exists():
                kept = f"val_tokens.before-{step}.npy"
                os.replace(path, run_dir / kept)
            _write_atomic(path, lambda f: np.save(f, val))
    except OSError as exc:
        raise TrainerError(f"cannot keep the tokenizer and validation tokens in {run_dir}: {exc.strerror or exc}") \
            from None
    return kept


def data_fingerprint(data: PreparedData) -> dict:
    """What a checkpoint records of the data it trained on: the source text's SHA-256 and the split sizes."""
    return {"text_sha256": data.text_sha256, "train_tokens": int(len(data.train)), "val_tokens": int(len(data.val))}


def check_same_data(ckpt_name: str, saved: dict | None, data: PreparedData, allow: bool) -> str | None:
    """Refuse (DataError) resuming `ckpt_name` on data other than the fingerprint `saved` it recorded, unless
    `allow`; returns a line for the user (the note for a checkpoint without a fingerprint, the allowed change)."""
    if not isinstance(saved, dict):
        return (f"trainer: note: {ckpt_name} predates data fingerprints: the training text is not checked against "
                "it (checkpoints from now on record it)")
    now = data_fingerprint(data)
    changed = []
    if saved.get("text_sha256") != now["text_sha256"]:
        changed.append(f"the text's sha256 {str(saved.get('text_sha256'))[:12]} -> {str(now['text_sha256'])[:12]}")
    changed += [f"{key.replace('_', ' ')} {saved.get(key)} -> {now[key]}" for key in ("train_tokens", "val_tokens")
                if saved.get(key) != now[key]]
    if not changed:
        return None
    what = f"{ckpt_name} was trained on other data ({data.text_label()}: {'; '.join(changed)})"
    if not allow:
        raise DataError(f"{what}; restore the original text, start a new --run.name, or pass --allow-data-change "
                        "if the change is meant")
    return f"trainer: warning: {what}; resuming on the new data (--allow-data-change)"


def read_val_tokens(path: Path) -> np.ndarray:
    """RUN_DIR/val_tokens.npy, memory-mapped; a damaged or truncated file is one DataError naming it and the cure."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as exc:  # numpy's words for a bad header or a file shorter than its header says
        raise DataError(f"{path} is damaged or truncated ({exc}): delete it; `trainer run` on this config writes it "
                        "again from the training data, and `trainer eval` re-derives the split from that data "
                        "(`trainer prepare` checks the data is there)") from None


def load(run_dir: Path, tokenizer_json: str | None = None, train: np.ndarray | None = None,
         val: bool = True) -> PreparedData | None:
    """The run's own data (tokenizer, validation tokens; `train` if the caller has it), or None if the run
    predates these files. `tokenizer_json` (from a checkpoint) stands in for a missing tokenizer.json.
    `val=False` leaves the validation tokens unread (empty): sampling needs only the tokenizer."""
    tok_path, val_path = run_dir / TOKENIZER, run_dir / VAL_TOKENS
    if not val_path.exists() or not (tok_path.exists() or tokenizer_json):
        return None
    if not tok_path.exists():
        tok_path = Path(tempfile.mkdtemp(prefix="helios-tok-")) / TOKENIZER
        tok_path.write_text(tokenizer_json, encoding="utf-8")
    tok_bytes = tok_path.read_bytes()
    vocab = load_tokenizer(tok_path).get_vocab_size()
    tokens = read_val_tokens(val_path) if val else np.zeros(0, dtype=np.int32)
    empty = np.zeros(0, dtype=tokens.dtype)
    return PreparedData(run_dir, run_dir, tok_path, sha256_bytes(tok_bytes), vocab,
                        train if train is not None else empty, tokens)
