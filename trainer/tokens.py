"""Tokenizer and token arrays: byte-level BPE trained on the training split, tokens as a uint16/uint32 memmap.

`prepare_data(cfg)` is idempotent: it reuses the cache when the text, vocab and split are unchanged.
`BatchSampler` draws (x, y) batches from a seeded numpy Generator whose state goes into checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config import Config
from trainer.data import EOT, NAMED_DATASETS, clean_text, read_texts, write_text_atomic
from trainer.errors import ConfigError, DataError

CACHE_FORMAT = 1


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of bytes."""
    return hashlib.sha256(data).hexdigest()


def train_bpe(text: str, vocab_size: int) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` trained on text, with <|endoftext|> as id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_chunks(text), trainer=trainer)
    return tok


def _chunks(text: str, size: int = 1 << 16) -> list[str]:
    """Text in pieces cut at line ends (the pre-tokenizer splits at whitespace anyway)."""
    out, start = [], 0
    while start < len(text):
        end = text.find("\n", min(start + size, len(text))) + 1 or len(text)
        out.append(text[start:end])
        start = end
    return out


def encode(tok: Any, text: str) -> np.ndarray:
    """Token ids of text as a uint32 array (encoded in line-aligned chunks, in parallel)."""
    encodings = tok.encode_batch(_chunks(text, 1 << 12), add_special_tokens=False)
    return np.concatenate([np.asarray(e.ids, dtype=np.uint32) for e in encodings] or [np.zeros(0, np.uint32)])


def load_tokenizer(path: Path) -> Any:
    """Load a saved tokenizer.json."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on a bad file
        raise DataError(f"cannot load tokenizer {path}: {exc}") from None


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 65536 else np.uint32)


@dataclass(frozen=True)
class PreparedData:
    """A tokenized dataset on disk: tokenizer, train/val token memmaps, and their provenance."""

    cache_dir: Path
    text_path: Path
    tokenizer_path: Path
    tokenizer_hash: str
    tokenizer_vocab: int
    train: np.ndarray
    val: np.ndarray
    text_sha256: str | None = None  # of the source text as read (None: a run directory's own copy of the data)
    text_files: tuple[Path, ...] = ()  # every file the text was read from (text_path: the first path configured)

    def tokenizer(self) -> Any:
        """The tokenizer object."""
        return load_tokenizer(self.tokenizer_path)

    def text_label(self) -> str:
        """Where the text came from, for messages: its file, or the first few of its files."""
        if len(self.text_files) <= 1:
            return str(self.text_path)
        more = f" and {len(self.text_files) - 3} more" if len(self.text_files) > 3 else ""
        return ", ".join(map(str, self.text_files[:3])) + more


def text_source(cfg: Config) -> tuple[list[Path], Path]:
    """(the configured text paths, directory the cache goes in) for the dataset, fetching named datasets."""
    d = cfg.data
    if d.path is not None:
        paths = [Path(p) for p in ((d.path,) if isinstance(d.path, str) else d.path)]
        base = Path(d.cache_dir) if d.cache_dir else paths[0].parent
        if len(paths) == 1:
            return paths, base / f"{paths[0].name}.helios"
        # Several paths share one cache only when they are the same list (meta.json's text hash guards the rest).
        key = sha256_bytes("\n".join(str(p.resolve()) for p in paths).encode("utf-8"))[:8]
        return paths, base / f"{paths[0].name}+{len(paths) - 1}-{key}.helios"
    base = Path(d.cache_dir) if d.cache_dir else Path(d.root)
    return [NAMED_DATASETS[d.dataset](Path(d.root))], base / d.dataset


def _split_point(text: str, val_fraction: float) -> int:
    """Character index where validation text starts, moved to a line start when one is near."""
    cut = int(len(text) * (1 - val_fraction))
    newline = text.find("\n", cut)
    return newline + 1 if 0 <= newline < len(text) - 1 else cut


def prepare_data(cfg: Config, tokenizer_json: str | None = None) -> PreparedData:
    """Fetch/read, clean, split, train the tokenizer and tokenize; cached under the dataset's directory.
    `tokenizer_json` (fine-tuning with init_from): tokenize with that tokenizer instead of training one."""
    paths, base = text_source(cfg)
    raw, files = read_texts(paths, cfg.data.text_field)
    text_hash = sha256_bytes(raw.encode("utf-8"))  # of every file's text: the cache key and the run's fingerprint
    vocab = cfg.model.vocab_size
    given = sha256_bytes(tokenizer_json.encode("utf-8")) if tokenizer_json else None
    cache = base / (f"bpe-{vocab}-val{cfg.data.val_fraction:g}" + (f"-tok{given[:12]}" if given else ""))
    meta_path = cache / "meta.json"
    want = {"format": CACHE_FORMAT, "text_sha256": text_hash, "vocab_size": vocab,
            "val_fraction": cfg.data.val_fraction, "tokenizer": cfg.data.tokenizer}
    if given:
        want["given_tokenizer"] = given
    meta = _read_meta(meta_path)
    if meta is None or any(meta.get(k) != v for k, v in want.items()) or not _cache_intact(cache, meta):
        try:
            meta = _build_cache(raw, cache, want, tokenizer_json)
        except OSError as exc:
            raise DataError(f"cannot write the data cache {cache}: {exc.strerror or exc}; set [data] cache_dir to a "
                            "writable folder (by default the cache goes next to the text file, or under [data] "
                            "root)") from None
    dtype = np.dtype(meta["dtype"])
    train = np.memmap(cache / "train.bin", dtype=dtype, mode="r", shape=(meta["train_tokens"],))
    val = np.memmap(cache / "val.bin", dtype=dtype, mode="r", shape=(meta["val_tokens"],))
    tok_path = cache / "tokenizer.json"
    data = PreparedData(cache, paths[0], tok_path, sha256_bytes(tok_path.read_bytes()), meta["tokenizer_vocab"],
                        train, val, text_hash, tuple(files))
    check_fits(cfg, data)
    return data


def _cache_intact(cache: Path, meta: dict) -> bool:
    """The token files have the sizes meta.json records and the tokenizer its hash (else the cache is rebuilt)."""
    try:
        itemsize = np.dtype(meta["dtype"]).itemsize
        sizes_ok = all((cache / f"{split}.bin").stat().st_size == int(meta[f"{split}_tokens"]) * itemsize
                       for split in ("train", "val"))
        return sizes_ok and sha256_bytes((cache / "tokenizer.json").read_bytes()) == meta["tokenizer_sha256"]
    except (OSError, KeyError, TypeError, ValueError):
        return False


def _read_meta(path: Path) -> dict | None:
    """The cache's meta.json, or None when absent or unreadable (the cache is then rebuilt)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _build_cache(raw: str, cache: Path, want: dict, tokenizer_json: str | None = None) -> dict:
    """Clean, split, train BPE on the train part, tokenize both parts, write everything atomically."""
    text = clean_text(raw)
    cut = _split_point(text, want["val_fraction"])
    train_text, val_text = text[:cut], text[cut:]
    if not train_text.strip() or not val_text.strip():
        raise DataError(f"text too short to split into train and validation ({len(text)} characters)")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create data cache {cache}: {exc.strerror or exc}") from None
    tok_json = tokenizer_json or train_bpe(train_text, want["vocab_size"]).to_str()
    write_text_atomic(cache / "tokenizer.json", tok_json)
    # Encode with the reloaded tokenizer, exactly what later runs load (and 2-3x faster than the freshly trained
    # object, whose BPE model comes back from training without its word cache).
    tok = load_tokenizer(cache / "tokenizer.json")
    dtype = token_dtype(tok.get_vocab_size())
    counts = {}
    for split, part in (("train", train_text), ("val", val_text)):
        ids = encode(tok, part).astype(dtype)
        tmp = cache / f".{split}.bin.tmp{os.getpid()}"  # per process: two runs may prepare one dataset at once
        try:
            ids.tofile(tmp)
            os.replace(tmp, cache / f"{split}.bin")
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DataError(f"cannot write the token cache {cache / f'{split}.bin'}: {exc.strerror or exc}") from None
        counts[split] = int(ids.size)
    meta = dict(want, dtype=dtype.name, tokenizer_vocab=tok.get_vocab_size(), tokenizer_sha256=sha256_bytes(
        tok_json.encode("utf-8")), train_tokens=counts["train"], val_tokens=counts["val"])
    write_text_atomic(cache / "meta.json", json.dumps(meta, indent=2))
    return meta


def check_fits(cfg: Config, data: PreparedData) -> None:
    """Reject a config the data cannot serve: a block longer than a split, a vocab smaller than the tokenizer's."""
    shortest = min(len(data.train), len(data.val))
    if cfg.model.block_size + 1 > shortest:
        which = "validation" if len(data.val) < len(data.train) else "training"
        raise ConfigError(
            f"[model] block_size = {cfg.model.block_size} is not allowed: the {which} split has only {shortest} "
            f"tokens, so block_size must be at most {max(shortest - 1, 0)} (use a longer text or a smaller block)"
        )
    if data.tokenizer_vocab > cfg.model.vocab_size:
        raise ConfigError(f"[model] vocab_size = {cfg.model.vocab_size} is not allowed: the tokenizer has "
                          f"{data.tokenizer_vocab} tokens")


class BatchSampler:
    """Random (x, y) windows from a token array, driven by a seeded numpy Generator (its state is checkpointed)."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, rng: np.random.Generator):
        self.tokens, self.block_size, self.batch_size, self.rng = tokens, block_size, batch_size, rng
        self._offsets = np.arange(block_size + 1)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """One batch: x and y int32 [batch_size, block_size], y shifted one token right of x."""
        starts = self.rng.integers(0, len(self.tokens) - self.block_size, size=self.batch_size)
        window = np.asarray(self.tokens[starts[:, None] + self._offsets], dtype=np.int32)
        return window[:, :-1], window[:, 1:]

    def state(self) -> dict:
        """The Generator's state (JSON-able)."""
        return self.rng.bit_generator.state

    def set_state(self, state: dict) -> None:
        """Restore a state from `state()`."""
        self.rng.bit_generator.state = state
