"""`python -m trainer {run,sample,eval,prepare}`: the only layer that prints.

Every TrainerError, and every HeliosError the engine raises on purpose (no Vulkan driver, a device
without timeline semaphores, out of device memory), becomes one line on stderr and its exit code
(2 for bad input), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from helios.errors import HeliosError
from trainer.backend import BACKENDS
from trainer.errors import TrainerError

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "shakespeare.toml"

EPILOG_OVERRIDES = """\
Any config key can be overridden as --section.key=value (the value is read as TOML), e.g.
  python -m trainer run configs/shakespeare.toml --train.max_iters=50 --model.n_layer=2 --run.name=quick
Signals: SIGTERM (and Ctrl-C) write a checkpoint and exit; SIGUSR1 writes one and continues.
Running again on the same run directory resumes from its latest checkpoint (--resume auto)."""


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree for all four commands."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m trainer", description="helios GPT trainer", formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="train (or resume) a model from a TOML config", formatter_class=fmt,
                         description="Train a GPT from CONFIG.toml; logs go to RUN_DIR/metrics.jsonl.",
                         epilog=EPILOG_OVERRIDES)
    run.add_argument("config", metavar="CONFIG.toml", help="training configuration (see configs/)")
    run.add_argument("--backend", choices=list(BACKENDS), default="helios",
                     help="helios: Vulkan compute (default); torch: the PyTorch CPU reference")
    run.add_argument("--resume", choices=["auto", "never"], default="auto",
                     help="auto: continue from RUN_DIR's latest checkpoint if any (default); "
                          "never: refuse if one exists")

    sample = sub.add_parser("sample", help="generate text from a run's latest checkpoint",
                            description="Generate text from the latest checkpoint of a run directory.")
    sample.add_argument("--run", required=True, metavar="DIR", help="run directory (out_dir/name)")
    sample.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    sample.add_argument("--tokens", type=int, default=200, metavar="N", help="tokens to generate (default 200)")
    sample.add_argument("--temperature", type=float, default=0.8, metavar="T", help="0 = greedy (default 0.8)")
    sample.add_argument("--top-k", type=int, default=50, metavar="K", help="sample among the K likeliest; 0 = all")
    sample.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed (default 0)")
    sample.add_argument("--backend", choices=list(BACKENDS), default=None, help="default: the run's own")

    ev = sub.add_parser("eval", help="evaluate a run's latest checkpoint on its validation split",
                        description="Mean loss of the latest checkpoint over the fixed eval batches.")
    ev.add_argument("--run", required=True, metavar="DIR", help="run directory (out_dir/name)")
    ev.add_argument("--backend", choices=list(BACKENDS), default=None, help="default: the run's own")
    ev.add_argument("--json", action="store_true", help="print one JSON object")

    prep = sub.add_parser("prepare", help="fetch the dataset and train the tokenizer (no training)",
                          formatter_class=fmt, epilog="Config keys can be overridden as --section.key=value.",
                          description="Download/read the text, train the BPE tokenizer, tokenize into memmaps.")
    prep.add_argument("config", nargs="?", metavar="CONFIG.toml", default=None,
                      help=f"configuration whose [data] and vocab to prepare (default {DEFAULT_CONFIG.name})")
    return parser


def split_overrides(extra: list[str]) -> list[str]:
    """Leftover argv -> ["section.key=value", ...]; accepts --section.key=value and --section.key value."""
    from trainer.errors import ConfigError

    out, i = [], 0
    while i < len(extra):
        arg = extra[i]
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ConfigError(f"unrecognized argument '{arg}': overrides look like --section.key=value")
        if "=" in arg:
            out.append(arg[2:])
            i += 1
        elif i + 1 < len(extra):
            out.append(f"{arg[2:]}={extra[i + 1]}")
            i += 2
        else:
            raise ConfigError(f"override '{arg}' has no value: use {arg}=VALUE")
    return out


@contextmanager
def signal_controls(controls) -> Iterator[None]:
    """SIGTERM/SIGINT -> checkpoint and stop; SIGUSR1 -> checkpoint and go on. Restores old handlers after."""
    def stop(signum, _frame):
        if controls.stop_requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C means now
        controls.stop_requested = signal.Signals(signum).name

    def save(_signum, _frame):
        controls.save_requested = True

    wanted = {signal.SIGTERM: stop, signal.SIGINT: stop, signal.SIGUSR1: save}
    old = {sig: signal.signal(sig, handler) for sig, handler in wanted.items()}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def cmd_run(args: argparse.Namespace, overrides: list[str]) -> int:
    """Train or resume; returns the exit code."""
    from telemetry.events import METRICS_FILE, MetricsWriter
    from trainer import env
    from trainer.backend import create_backend
    from trainer.checkpoint import LATEST, load_latest, remove_stale_temps
    from trainer.config import load_config
    from trainer.loop import Controls, Trainer, check_checkpoint_matches
    from trainer.progress import make_progress
    from trainer.runlock import RunLock
    from trainer.session import prepare_run_dir, write_resolved
    from trainer.tokens import prepare_data

    cfg = load_config(args.config, overrides)
    env.check_all()
    run_dir = cfg.run.dir
    prepare_run_dir(run_dir)
    with RunLock(run_dir):
        remove_stale_temps(run_dir)  # left by a trainer that was killed mid-write; we hold the lock
        if args.resume == "never" and (run_dir / LATEST).exists():
            raise TrainerError(f"{run_dir} already holds a run (latest checkpoint "
                               f"{(run_dir / LATEST).read_text().strip()[:40]}); use --resume auto "
                               "to continue it or a new --run.name")
        ckpt = load_latest(run_dir)
        data = prepare_data(cfg)
        if ckpt is not None:
            check_checkpoint_matches(cfg, data, ckpt)  # before the backend: a mismatch must not cost a model
        backend = create_backend(args.backend, cfg.model, cfg.optim, cfg.train.seed)
        backend.check_batch(cfg.train.batch_size, cfg.model.block_size)
        controls = Controls()
        progress = make_progress(cfg.train.log_interval)
        trainer = Trainer(cfg, backend, args.backend, data, run_dir, listener=progress, controls=controls)
        if ckpt is not None:
            trainer.restore(ckpt)
        write_resolved(run_dir, cfg, args.backend)
        try:
            with MetricsWriter(run_dir / METRICS_FILE) as writer, signal_controls(controls):
                outcome = trainer.run(writer)
        finally:
            progress.close()
    print(f"run directory: {run_dir}")
    if outcome == "stopped" and controls.stop_requested == "SIGINT":
        return 130
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    """Print a sample from a run's latest checkpoint."""
    from trainer.loop import sample_text
    from trainer.session import load_run

    if args.tokens < 0 or args.temperature < 0 or args.top_k < 0:
        raise TrainerError("--tokens, --temperature and --top-k must not be negative")
    loaded = load_run(Path(args.run), args.backend)
    rng = np.random.default_rng(args.seed)
    text = sample_text(loaded.backend, loaded.trainer.tokenizer, args.prompt, args.tokens, args.temperature,
                       args.top_k or None, rng)
    print(args.prompt + text)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Print the validation loss of a run's latest checkpoint."""
    from trainer.loop import evaluate
    from trainer.session import load_run

    loaded = load_run(Path(args.run), args.backend)
    loss = evaluate(loaded.cfg, loaded.backend, loaded.data.val)
    result = {"checkpoint": loaded.checkpoint, "step": loaded.trainer.step, "val_loss": loss,
              "eval_iters": loaded.cfg.train.eval_iters}
    print(json.dumps(result) if args.json else f"{loaded.checkpoint} (step {loaded.trainer.step}): val loss {loss:.4f}")
    return 0


def cmd_prepare(args: argparse.Namespace, overrides: list[str]) -> int:
    """Fetch and tokenize the configured dataset, then describe it."""
    from trainer.config import load_config
    from trainer.session import describe_data
    from trainer.tokens import prepare_data

    path = args.config if args.config is not None else (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    data = prepare_data(load_config(path, overrides))
    for key, value in describe_data(data).items():
        print(f"{key:17} {value:,}" if isinstance(value, int) else f"{key:17} {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command in ("run", "prepare"):
            overrides = split_overrides(extra)
            return cmd_run(args, overrides) if args.command == "run" else cmd_prepare(args, overrides)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return cmd_sample(args) if args.command == "sample" else cmd_eval(args)
    except TrainerError as exc:
        print(f"trainer: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except HeliosError as exc:
        print(f"trainer: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("trainer: interrupted", file=sys.stderr)
        return 130
