"""`trainer sample` and `trainer eval`: the commands that read a run's checkpoint without training it (their
arguments are built in trainer/cli.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from trainer.errors import TrainerError


def cmd_sample(args: argparse.Namespace) -> int:
    """Stream samples from a run's latest checkpoint."""
    from trainer.sampling import sample_record, stream_sample
    from trainer.session import load_run

    if args.tokens < 0 or not math.isfinite(args.temperature) or args.temperature < 0 or args.top_k < 0:
        raise TrainerError(f"--tokens, --temperature and --top-k must be finite and not negative (got --tokens "
                           f"{args.tokens}, --temperature {args.temperature}, --top-k {args.top_k})")
    if not 0 < args.top_p <= 1:  # NaN included
        raise TrainerError(f"--top-p must be above 0 and at most 1, got {args.top_p}")
    if args.num_samples < 1:
        raise TrainerError(f"--num-samples must be at least 1, got {args.num_samples}")
    if args.seed is not None and args.seed < 0:  # numpy's generators take only non-negative seeds
        raise TrainerError(f"--seed must be 0 or more, got {args.seed}")
    loaded = load_run(Path(args.run), args.backend, val=False, choice=args.ckpt)  # sampling needs no validation tokens
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    if args.seed is None:
        print(f"seed {seed} (pass --seed {seed} to draw the same samples again)", file=sys.stderr)
    rng = np.random.default_rng(seed)

    def write(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    try:
        for k in range(args.num_samples):
            if k and not args.json:
                write("\n---\n")
            if not args.json:
                write(args.prompt)
            text = stream_sample(loaded.backend, loaded.trainer.tokenizer, args.prompt, args.tokens,
                                 args.temperature, args.top_k or None, rng, (lambda _: None) if args.json else write,
                                 stop_at_eot=not args.ignore_eot, top_p=args.top_p if args.top_p < 1 else None)
            if args.json:  # one line per sample, with what the sampler did (trainer/backend.py SampleStats)
                write(json.dumps({"event": "sample", "prompt": args.prompt, "text": text,
                                  **sample_record(loaded.backend.sample_stats, loaded.cfg.model.block_size)}) + "\n")
        if not args.json:
            write("\n")
    except KeyboardInterrupt:  # what was printed stays; no traceback
        write("\n")
        return 130
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Print the loss and perplexity of a run's latest checkpoint on its validation and/or training split and/or a
    held-out text (--data)."""
    from trainer.config import MAX_EVAL_ITERS
    from trainer.loop import check_data_fit, evaluate, evaluate_whole
    from trainer.session import held_out_tokens, load_run, training_tokens

    whole = args.eval_iters == "all"
    if args.eval_iters is not None and not whole and not (args.eval_iters.isdigit() and int(args.eval_iters) > 0):
        raise TrainerError(f"--eval-iters must be at least 1 (a whole number) or all, got {args.eval_iters}")
    if args.eval_iters is not None and not whole and int(args.eval_iters) > MAX_EVAL_ITERS:  # before any model
        raise TrainerError(f"--eval-iters {args.eval_iters} is too many: at most {MAX_EVAL_ITERS:,} batches (and at "
                           "most those that cover the split); --eval-iters all scores every window once")
    if args.data is not None and not Path(args.data).exists():  # before any model
        raise TrainerError(f"--data {args.data} does not exist: name a text file, a .jsonl file or a folder of them")
    loaded = load_run(Path(args.run), args.backend, choice=args.ckpt)
    if loaded.note:
        print(f"trainer: note: {loaded.note}", file=sys.stderr)
    cfg = loaded.cfg
    if args.eval_iters is not None and not whole:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, eval_iters=int(args.eval_iters)))
    split = args.split or (None if args.data else "val")
    splits = (["val", "train"] if split == "both" else [split] if split else []) + (["data"] if args.data else [])
    names = {"val": "val", "train": "train", "data": args.data}
    result: dict = {"checkpoint": loaded.checkpoint, "step": loaded.trainer.step,
                    "eval_iters": "all" if whole else cfg.train.eval_iters}
    if args.data:
        result["data"] = args.data
    done: list[str] = []
    try:
        for split in splits:  # val first: it needs nothing but the run directory
            if split == "data":
                tokens = held_out_tokens(loaded, Path(args.data))
            else:
                tokens = loaded.data.val if split == "val" else training_tokens(loaded)
            if not whole:
                check_data_fit(cfg, None, len(tokens), cfg.train.batch_size, names[split])
            if whole:
                loss, result[f"{split}_tokens"] = evaluate_whole(cfg, loaded.backend, tokens)
            else:
                loss = evaluate(cfg, loaded.backend, tokens)
            result[f"{split}_loss"], result[f"{split}_perplexity"] = loss, math.exp(min(loss, 700.0))
            done.append(split)
    finally:  # what was evaluated is printed even when a later split fails
        if done and args.json:
            print(json.dumps(result))
        elif done:
            parts = [f"{names[s]} loss {result[f'{s}_loss']:.4f} (perplexity {result[f'{s}_perplexity']:,.2f}"
                     + (f", {result[f'{s}_tokens']:,} tokens)" if whole else ")") for s in done]
            print(f"{loaded.checkpoint} (step {loaded.trainer.step}): " + ", ".join(parts))
    return 0


__all__ = ["cmd_eval", "cmd_sample"]
