"""`python -m trainer {run,sample,eval,prepare}`: the only layer that prints.

Every TrainerError, and every HeliosError the engine raises on purpose (no Vulkan driver, a device
without timeline semaphores, out of device memory), becomes one line on stderr and its exit code
(2 for bad input), never a traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helios.errors import HeliosError
from trainer import distributed, resume
from trainer.backend import backend_names
from trainer.errors import TrainerError

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "shakespeare.toml"

EPILOG_OVERRIDES = """\
Any config key can be overridden as --section.key=value (the value is read as TOML), e.g.
  python -m trainer run configs/shakespeare.toml --train.max_iters=50 --model.n_layer=2 --run.name=quick
Signals: SIGTERM, SIGHUP and Ctrl-C write a checkpoint and exit; SIGUSR1 writes one and continues.
Running again on the same run directory resumes from its latest checkpoint (--resume auto)."""


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree for all four commands."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m trainer", description="helios GPT trainer", formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    backends = backend_names()

    run = sub.add_parser("run", help="train (or resume) a model from a TOML config", formatter_class=fmt,
                         description="Train a GPT from CONFIG.toml; logs go to RUN_DIR/metrics.jsonl.",
                         epilog=EPILOG_OVERRIDES)
    run.add_argument("config", metavar="CONFIG.toml", help="training configuration (see configs/)")
    run.add_argument("--backend", choices=backends, default="helios",
                     help="helios: Vulkan compute (default); torch: the PyTorch CPU reference")
    run.add_argument("--resume", choices=["auto", "never"], default="auto",
                     help="auto: continue from RUN_DIR's latest checkpoint if any (default); "
                          "never: refuse if one exists")
    run.add_argument("--nproc", type=int, default=None, metavar="N",
                     help="train data-parallel on N processes: runs `mpiexec -n N python -m trainer run ...` "
                          "(each rank trains batch_size rows of an N x batch_size global batch)")
    run.add_argument("--allow-data-change", action="store_true",
                     help="resume even though the training text or its split changed since the checkpoint "
                          "(default: refuse; the old val_tokens.npy is kept as val_tokens.before-<step>.npy)")

    sample = sub.add_parser("sample", help="generate text from a run's latest checkpoint",
                            description="Generate text from the latest checkpoint of a run directory.")
    sample.add_argument("--run", required=True, metavar="DIR", help="run directory (out_dir/name)")
    sample.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    sample.add_argument("--tokens", type=int, default=200, metavar="N", help="tokens to generate (default 200)")
    sample.add_argument("--temperature", type=float, default=0.8, metavar="T", help="0 = greedy (default 0.8)")
    sample.add_argument("--top-k", type=int, default=50, metavar="K", help="sample among the K likeliest; 0 = all")
    sample.add_argument("--top-p", type=float, default=1.0, metavar="P",
                        help="then among the fewest likeliest tokens whose probability reaches P (nucleus "
                             "sampling); 1 = all (default)")
    sample.add_argument("--seed", type=int, default=None, metavar="S",
                        help="sampling seed (default: a new one each call, printed to stderr for reuse)")
    sample.add_argument("--num-samples", type=int, default=1, metavar="N", help="samples to draw (default 1)")
    sample.add_argument("--ignore-eot", action="store_true",
                        help="keep generating past the end-of-text token (default: stop there)")
    sample.add_argument("--backend", choices=backends, default=None, help="default: the run's own")
    sample.add_argument("--json", action="store_true",
                        help="print each sample as one JSON line (text, tokens, seconds, tok/s, and the sampling "
                             "window's KV-cache refills past block_size) instead of streaming the text")
    sample.add_argument("--ckpt", default=None, metavar="NAME",
                          help="checkpoint to use: a name in the run directory (ckpt-3000, ckpt-best) or a path "
                             "(default: latest; latest is not moved)")

    ev = sub.add_parser("eval", help="evaluate a run's latest checkpoint on its validation split",
                        description="Mean loss of the latest checkpoint over the fixed eval batches.")
    ev.add_argument("--run", required=True, metavar="DIR", help="run directory (out_dir/name)")
    ev.add_argument("--backend", choices=backends, default=None, help="default: the run's own")
    ev.add_argument("--ckpt", default=None, metavar="NAME",
                      help="checkpoint to use: a name in the run directory (ckpt-3000, ckpt-best) or a path "
                             "(default: latest; latest is not moved)")
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    ev.add_argument("--split", choices=["val", "train", "both"], default=None,
                    help="which split (default val, or none with --data; train needs the run's training text)")
    ev.add_argument("--data", default=None, metavar="PATH",
                    help="also (or, without --split, only) a held-out text: a file, .jsonl file or folder as [data] "
                         "path takes, tokenized with the run's tokenizer")
    ev.add_argument("--eval-iters", default=None, metavar="N|all",
                    help="batches per split (default: the run's train.eval_iters); all: every window of the split")

    exp = sub.add_parser("export", help="write a run's latest checkpoint as a Hugging Face model directory",
                         description="config.json + model.safetensors (+ tokenizer.json) that "
                                     "transformers.AutoModelForCausalLM.from_pretrained loads.")
    exp.add_argument("--run", required=True, metavar="DIR", help="run directory (out_dir/name)")
    exp.add_argument("--out", required=True, metavar="DIR", help="directory to write the model into")
    exp.add_argument("--force", action="store_true",
                     help="write into --out even if it is a folder that is not empty (never the run directory)")
    exp.add_argument("--ckpt", default=None, metavar="NAME",
                       help="checkpoint to use: a name in the run directory (ckpt-3000, ckpt-best) or a path "
                             "(default: latest; latest is not moved)")

    show = sub.add_parser("config", help="print the resolved config and the model's size, without training",
                          formatter_class=fmt, epilog="Config keys can be overridden as --section.key=value.",
                          description="The configuration a run would use, every default filled in, and the "
                                      "model's parameters, FLOPs per token and memory floor.")
    show.add_argument("config", metavar="CONFIG.toml", help="training configuration (see configs/)")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.add_argument("--get", metavar="SECTION.KEY", default=None,
                      help="print only this resolved value, e.g. run.dir (the run directory) or train.max_iters")
    sub.add_parser("configs", help="list the shipped configs", description="The configs in configs/, one line each.")

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
def signal_controls(controls, acknowledge=None) -> Iterator[None]:
    """SIGTERM/SIGINT/SIGHUP -> checkpoint and stop; SIGUSR1 -> checkpoint and go on. Restores old handlers after.
    `acknowledge(line)`, if given, tells the user at once what will happen (the step in flight finishes first)."""
    def tell(line: str) -> None:
        # From a thread, never from the handler itself: the handler interrupts the main thread, which may be inside
        # the console's print (holding its lock) while the live display's refresh thread waits for that lock;
        # printing here would wait for the refresh thread, which waits for us (a hang seen in a terminal run).
        if acknowledge is not None:
            threading.Thread(target=acknowledge, args=(line,), name="signal-acknowledge", daemon=True).start()

    def stop(signum, _frame):
        if controls.stop_requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C means now
        controls.stop_requested = signal.Signals(signum).name
        tell(f"{controls.stop_requested}: stopping after this step with a checkpoint "
             "(Ctrl-C again to stop at once, without one)")

    def save(_signum, _frame):
        controls.save_requested = True
        tell("SIGUSR1: writing a checkpoint after this step, then going on")

    # SIGHUP (the terminal closed) stops like SIGTERM: a run started in a terminal that is then closed checkpoints.
    wanted = {signal.SIGTERM: stop, signal.SIGINT: stop, signal.SIGHUP: stop, signal.SIGUSR1: save}
    old = {sig: signal.signal(sig, handler) for sig, handler in wanted.items()}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def cmd_run(args: argparse.Namespace, overrides: list[str]) -> int:
    """Train or resume; returns the exit code."""
    from telemetry.events import METRICS_FILE, MetricsWriteError, MetricsWriter
    from trainer import env
    from trainer.backend import create_backend
    from trainer.checkpoint import held_checkpoint, load_resumable, remove_stale_temps
    from trainer.config import load_config
    from trainer.loop import Controls, Trainer, check_checkpoint_matches, check_data_fit
    from trainer.progress import make_progress
    from trainer.session import prepare_run_dir, write_resolved
    from trainer.tokens import prepare_data

    cfg = load_config(args.config, overrides)
    env.check_all()
    world = distributed.world()
    _warn_if_no_cache(world)
    if world.is_main:
        _warn_about_schedule(cfg)
    if args.backend == "helios":  # device and memory settings fail here, before the run directory exists
        from helios import runtime as rt
        from trainer.device_check import check_device

        check_device(cfg.model, rt.get_runtime().info)
    run_dir = cfg.run.dir
    if world.is_main:
        prepare_run_dir(run_dir)
    # Rank 0 alone holds the run directory's lock and writes in it; the others read checkpoints from it.
    with _locked_run_dir(run_dir) if world.is_main else _nothing():
        if world.is_main:
            remove_stale_temps(run_dir)  # left by a trainer that was killed mid-write; we hold the lock
        world.barrier()
        held = held_checkpoint(run_dir)
        if args.resume == "never" and held:
            raise TrainerError(f"{run_dir} already holds a run (latest checkpoint {held}); use --resume auto "
                               "to continue it or a new --run.name")
        ckpt, note = load_resumable(run_dir)
        if note and world.is_main:
            print(f"trainer: note: {note}", file=sys.stderr)
        plan, tokenizer_json = _init_source(cfg, run_dir, ckpt)
        for line in plan.report() if plan is not None and world.is_main else []:
            print(f"trainer: warning: {line}", file=sys.stderr)
        data = _prepare_data_in_turn(cfg, world, lambda c: prepare_data(c, tokenizer_json))
        check_data_fit(cfg, len(data.train), len(data.val), cfg.train.batch_size * world.size)
        if ckpt is not None:
            check_checkpoint_matches(cfg, data, ckpt)  # before the backend: a mismatch must not cost a model
            from trainer.run_artifacts import check_same_data

            data_line = check_same_data(ckpt.path.name, ckpt.state.get("data"), data, args.allow_data_change)
            if data_line and world.is_main:
                print(data_line, file=sys.stderr)
            if ckpt.step >= cfg.train.max_iters:  # nothing runs, so nothing is written: resolved.json keeps
                if world.is_main:  # the settings the run was trained with
                    print(f"trainer: nothing to train: the run is at step {ckpt.step} of {cfg.train.max_iters} "
                          "([train] max_iters); raise --train.max_iters to continue", file=sys.stderr)
                return 0
            cfg, notes = resume.fit_to_ranks(cfg, resume.SavedBatch.of(ckpt.state), world.size, ckpt.path.name)
            if world.is_main:
                for line in notes + resume.resume_warnings(cfg, ckpt, world.size):
                    print(line, file=sys.stderr)
        backend = create_backend(args.backend, cfg.model, cfg.optim, cfg.train.seed)
        backend.check_batch(cfg.train.batch_size, cfg.model.block_size)
        if plan is not None:  # fine-tuning: the source's weights, a fresh optimizer, step 0
            from trainer.init_from import initial_state

            backend.load_state_dict(initial_state(plan, backend.state_dict()))
        controls = Controls()
        progress = make_progress(cfg.train.log_interval) if world.is_main else _Quiet()
        console = progress
        backend.on_compile(console.compiling)
        if cfg.telemetry.tensorboard and world.is_main:  # TensorBoard files too: the sink forwards to progress
            from telemetry.tensorboard import TensorBoardSink

            progress = TensorBoardSink(run_dir, forward=progress)
        trainer = Trainer(cfg, backend, args.backend, data, run_dir, listener=progress, controls=controls,
                          world=world)
        if ckpt is not None:
            trainer.restore(ckpt)
        if world.is_main:  # every check has passed: now the run directory is written
            from trainer import run_artifacts

            write_resolved(run_dir, cfg, args.backend)
            kept = run_artifacts.save(run_dir, data, trainer.step)
            if kept:
                print(f"trainer: note: the validation split changed: val_loss from step {trainer.step} on is "
                      f"measured on the new one; the old one is kept as {run_dir / kept}", file=sys.stderr)
        try:
            with (MetricsWriter(run_dir / METRICS_FILE) if world.is_main else _nothing()) as writer, \
                    signal_controls(controls, console.say):
                outcome = trainer.run(writer)
        except MetricsWriteError as exc:  # a full disk: one line, and the checkpoints written so far stay whole
            raise TrainerError(f"{exc.strerror}: stopped at step {trainer.step}; the run directory keeps its latest "
                               "complete checkpoint: free some space and run the same command to resume") from None
        finally:
            progress.close()
            backend.on_compile(None)
    if outcome == "stalled":  # the launcher's watchdog named a stalled peer: it reports, and ends the job
        world.wait_to_be_ended(f"ckpt-{trainer.step}" if world.is_main else "")
    if world.is_main:
        print(f"run directory: {run_dir}")
        if outcome == "stopped":
            print(f"stopped at step {trainer.step} of {cfg.train.max_iters}; resume with: "
                  f"{_resume_command(args, overrides)}")
        elif outcome == "early_stopped":
            kept = ", kept in ckpt-best" if cfg.train.keep_best else ""
            print(f"early stop at step {trainer.step} of {cfg.train.max_iters}: the val loss has not improved for "
                  f"{cfg.train.early_stop_patience} evals (best {trainer.best_val:.4f} at step {trainer.best_step}"
                  f"{kept}); ckpt-{trainer.step} written")
    if outcome == "stopped" and controls.stop_requested == "SIGINT":
        return 130
    return 0


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


@contextmanager
def _locked_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold the run lock; a run refused before it wrote anything (bad data, a bad init_from) leaves no
    directory behind that holds only the lock file."""
    from trainer.runlock import RunLock
    from trainer.session import remove_if_unused

    acquired = False
    try:
        with RunLock(run_dir):
            acquired = True
            yield
    except BaseException:
        if acquired:  # a lock another trainer holds (RunLock refused us) is not ours to remove
            remove_if_unused(run_dir)
        raise


class _Quiet:
    """The progress display of ranks other than 0: they print nothing but errors."""

    def __call__(self, record: dict) -> None:
        pass

    def compiling(self, kernel: str, count: int, ms: float) -> None:
        pass

    def say(self, line: str) -> None:
        pass

    def close(self) -> None:
        pass


def _resume_command(args: argparse.Namespace, overrides: list[str]) -> str:
    """The command that continues this run: this Python, the same config, overrides, backend and rank count."""
    import shlex

    parts = [sys.executable, "-m", "trainer", "run", args.config, *(f"--{o}" for o in overrides)]
    if args.backend != "helios":
        parts += ["--backend", args.backend]
    if distributed.launched_size() > 1:  # the ranks never see --nproc: the launcher takes it out of their argv
        parts += ["--nproc", str(distributed.launched_size())]
    return " ".join(shlex.quote(p) for p in parts)


def _init_source(cfg, run_dir: Path, ckpt):
    """(init_from's checked plan or None, tokenizer JSON the data must use or None) for `trainer run`."""
    if not cfg.train.init_from:
        return None, None
    from trainer import run_artifacts
    from trainer.init_from import load_source, match_source

    own = run_dir / run_artifacts.TOKENIZER
    if ckpt is not None:  # resuming a fine-tuning run: its own copy of the source's tokenizer
        return None, own.read_text(encoding="utf-8") if own.exists() else ckpt.state.get("tokenizer_json")
    path = Path(cfg.train.init_from).expanduser()
    source = load_source(path, cfg.train, cfg.model)
    return match_source(source, cfg.model, cfg.train.init_strict), source.tokenizer_json


def _prepare_data_in_turn(cfg, world, prepare_data):
    """Rank 0 prepares (and caches) the tokens first; the other ranks then read its cache."""
    if world.is_main:
        data = prepare_data(cfg)
        world.barrier()
        return data
    world.barrier()
    return prepare_data(cfg)


def cmd_config(args: argparse.Namespace, overrides: list[str]) -> int:
    """Print the resolved config and the model's size."""
    from trainer.config import load_config
    from trainer.inspect_config import describe

    cfg = load_config(args.config, overrides)
    if args.get is not None:  # one value for scripts (the Makefile's RUN_DIR): nothing else on stdout
        from trainer.inspect_config import config_value

        print(config_value(cfg, args.get))
        return 0
    _warn_about_schedule(cfg)
    print(describe(cfg, as_json=args.json))
    return 0


def cmd_configs() -> int:
    """List the shipped configs."""
    import shutil

    from trainer.inspect_config import format_configs, shipped_configs

    print(format_configs(shipped_configs(), shutil.get_terminal_size().columns if sys.stdout.isatty() else None))
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
    raw = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command == "run" and args.nproc is not None and distributed.launched_size() == 1:
            # Checked once here, before any rank starts: a bad config or resume is one line, not one per rank.
            return distributed.relaunch(args.nproc, _without_nproc(raw), check=lambda: _check_launch(args, extra))
        if args.command in ("run", "prepare", "config"):
            overrides = split_overrides(extra)
            if args.command == "config":
                return cmd_config(args, overrides)
            return cmd_run(args, overrides) if args.command == "run" else cmd_prepare(args, overrides)
        if extra and args.command not in ("run", "prepare", "config"):  # only those take --section.key overrides
            raise TrainerError(f"unrecognized arguments: {' '.join(extra)} (see python -m trainer {args.command} -h)")
        if args.command == "configs":
            return cmd_configs()
        if args.command == "export":
            from trainer.export import check_out_dir, export_run

            check_out_dir(Path(args.run), Path(args.out), args.force)

            print(f"exported to {export_run(Path(args.run), Path(args.out), args.ckpt)}")
            return 0
        from trainer.run_readers import cmd_eval, cmd_sample

        return cmd_sample(args) if args.command == "sample" else cmd_eval(args)
    except (TrainerError, HeliosError) as exc:
        return _fail(f"trainer: error: {exc}", exc.exit_code)
    except KeyboardInterrupt:
        return _fail("trainer: interrupted", 130)
    except BrokenPipeError:
        # stdout's reader went away (`... | head`): the work is done or saved; say nothing more, and keep
        # Python's exit-time flush from reporting the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except BaseException:
        if distributed.launched_size() > 1:  # never leave the other ranks waiting in a collective
            import traceback

            traceback.print_exc()
            distributed.world().abort(1)
        raise


def _warn_if_no_cache(world) -> None:
    """One warning (rank 0's) before anything is written when HELIOS_CACHE_DIR cannot be written: the run goes
    on without the caches."""
    from helios.env import cache_warning

    warning = cache_warning()
    if warning and world.is_main:
        print(f"trainer: warning: {warning}", file=sys.stderr)


def _check_launch(args: argparse.Namespace, extra: list[str]) -> float:
    """The `--nproc` launcher's checks: a bad config, a resume that cannot split over the ranks or a run directory
    another trainer holds is one line here, before any rank starts (and no MPI abort follows it). Returns the
    watchdog's timeout (train.watchdog_s)."""
    from trainer.config import load_config
    from trainer.runlock import check_free

    cfg = load_config(args.config, split_overrides(extra))
    check_free(cfg.run.dir)
    resume.check_launch(cfg, args.nproc)
    _warn_if_oversubscribed(args.nproc)
    return cfg.train.watchdog_s


def _warn_about_schedule(cfg) -> None:
    """One warning when the warmup is longer than the run and so spans the whole run instead."""
    from trainer.schedule import warmup_warning

    line = warmup_warning(cfg.schedule)
    if line:
        print(f"trainer: warning: {line}", file=sys.stderr)


def _warn_if_oversubscribed(nproc: int) -> None:
    """More ranks than CPU cores: each rank's host work (and on lavapipe, its device work) then shares cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if nproc > cores:
        print(f"trainer: warning: --nproc {nproc} starts more ranks than this machine has CPU cores ({cores}): they "
              f"will share cores and each step will be slower than with fewer ranks; --nproc {cores} or less "
              "usually trains faster", file=sys.stderr)


def _fail(message: str, code: int) -> int:
    """Print the one-line error; in a data-parallel job, name the rank and end every rank with this code."""
    size = distributed.launched_size()
    try:
        w = distributed.world() if size > 1 else None
    except TrainerError:  # MPI itself is missing: each rank says so and exits
        w = None
    if w is not None:
        message = f"{message} (rank {w.rank} of {size}; ending the job)"
    print(message, file=sys.stderr)
    if w is not None:
        w.abort(code)
    return code


def _without_nproc(argv: list[str]) -> list[str]:
    """argv with the --nproc option (either `--nproc N` or `--nproc=N`) taken out."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out
