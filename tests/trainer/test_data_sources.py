"""[data] path as a user gives it: a list of files, a folder (its *.txt and *.jsonl files by name), a .jsonl file
whose records' text_field is a document; bad inputs are one line each (exit 2); the cache and the checkpoint's
data fingerprint cover every file, so changing any one of them is noticed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_python
from tests.trainer.conftest import make_corpus, write_config


def trainer(*args: str) -> subprocess.CompletedProcess:
    return run_python("-m", "trainer", *args, timeout=300)


def prepared(proc: subprocess.CompletedProcess) -> dict[str, str]:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(line.split(None, 1) for line in proc.stdout.splitlines())


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainer: error:"), proc.stderr
    return lines[0]


@pytest.fixture
def parts(tmp_path) -> Path:
    """A folder of three text files (b, a, c.txt by name) and one that is not text data (notes.md)."""
    folder = tmp_path / "texts"
    folder.mkdir()
    for i, name in enumerate(("b.txt", "a.txt", "c.txt")):
        (folder / name).write_text(make_corpus(500, seed=i), encoding="utf-8")
    (folder / "notes.md").write_text("not training text\n", encoding="utf-8")
    return folder


def test_a_folder_and_a_list_of_files_are_read_in_full(tmp_path, corpus, parts):
    config = write_config(tmp_path, corpus, "folder", data={"path": str(parts)})
    folder = prepared(trainer("prepare", str(config)))
    assert folder["text"].startswith(f"{parts / 'a.txt'}, {parts / 'b.txt'}, {parts / 'c.txt'}")  # by name
    listed = prepared(trainer("prepare", str(config), f'--data.path=["{parts / "a.txt"}", "{parts / "b.txt"}", '
                                                      f'"{parts / "c.txt"}"]'))
    assert listed["train_tokens"] == folder["train_tokens"] and listed["tokenizer_sha256"] == folder[
        "tokenizer_sha256"]
    one = prepared(trainer("prepare", str(config), f"--data.path={parts / 'a.txt'}"))
    assert int(folder["train_tokens"].replace(",", "")) > 2.5 * int(one["train_tokens"].replace(",", ""))
    # Files are documents: <|endoftext|> (id 0) between them.
    tokens = np.fromfile(Path(folder["cache"]) / "train.bin", dtype=folder["dtype"])
    assert int((tokens == 0).sum()) == 2


def test_jsonl_records_are_documents_of_text_field(tmp_path, corpus):
    lines = make_corpus(900, seed=3).splitlines()
    records = [{"id": i, "content": "\n".join(lines[i:i + 30])} for i in range(0, len(lines), 30)]
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    config = write_config(tmp_path, corpus, "jsonl", data={"path": str(data), "text_field": "content"})
    out = prepared(trainer("prepare", str(config)))
    tokens = np.concatenate([np.fromfile(Path(out["cache"]) / f"{s}.bin", dtype=out["dtype"]) for s in ("train",
                                                                                                        "val")])
    assert int((tokens == 0).sum()) == len(records) - 1
    missing = one_line_error(trainer("prepare", str(config), "--data.text_field=text"))
    assert f"{data}, line 1" in missing and '"text" field' in missing and "text_field" in missing


@pytest.mark.parametrize("case", ["missing_file_in_list", "empty_folder", "bad_json_line", "record_without_field",
                                  "field_not_a_string"])
def test_bad_data_inputs_are_one_line(tmp_path, corpus, case):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": make_corpus(50)}) + "\n", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    bad = tmp_path / "bad.jsonl"
    body = {"bad_json_line": '{"text": "fine"}\n{"text": "half\n',
            "record_without_field": '{"text": "fine"}\n\n{"body": "no text"}\n',
            "field_not_a_string": '{"text": "fine"}\n{"text": 3}\n'}.get(case, "")
    bad.write_text(body, encoding="utf-8")
    path, needles = {
        "missing_file_in_list": ([str(corpus), str(tmp_path / "gone.txt")], (f"{tmp_path / 'gone.txt'}",
                                                                             "does not exist")),
        "empty_folder": (str(tmp_path / "empty"), (f"data folder {tmp_path / 'empty'} holds no .txt or .jsonl",)),
        "bad_json_line": ([str(good), str(bad)], (f"{bad}, line 2: not a JSON record",)),
        "record_without_field": (str(bad), (f'{bad}, line 3: the record has no "text" field',)),
        "field_not_a_string": (str(bad), (f'{bad}, line 2: "text" is int, not a string',)),
    }[case]
    config = write_config(tmp_path, corpus, "bad", data={"path": path})
    line = one_line_error(trainer("prepare", str(config)))
    assert all(n in line for n in needles), line


def test_changing_any_file_of_a_folder_changes_the_fingerprint(tmp_path, corpus, parts):
    config = write_config(tmp_path, corpus, "fp", data={"path": str(parts)},
                          train={"max_iters": 2, "eval_interval": 0, "ckpt_interval": 0, "sample_tokens": 0})
    first = trainer("run", str(config), "--backend", "torch")
    assert first.returncode == 0, first.stderr[-2000:]
    # The last file's last two lines swapped: the same length, so the same split and tokenizer; only the validation
    # text differs, which only the fingerprint (a sha256 of every file's text) can tell.
    last = (parts / "c.txt").read_text(encoding="utf-8").splitlines()
    assert last[-1] != last[-2]
    (parts / "c.txt").write_text("\n".join(last[:-2] + [last[-1], last[-2]]) + "\n", encoding="utf-8")
    line = one_line_error(trainer("run", str(config), "--backend", "torch", "--train.max_iters=3"))
    assert "ckpt-2 was trained on other data" in line and "the text's sha256" in line, line
