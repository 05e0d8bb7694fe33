"""Streamed sampling for `trainer sample`: text appears as tokens are drawn, generation stops at the
end-of-text token, and a Ctrl-C keeps what was already printed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from trainer.backend import Backend, SampleStats
from trainer.loop import DEFAULT_PROMPT
from trainer.tokens import EOT


def stream_sample(backend: Backend, tokenizer: Any, prompt: str, n: int, temperature: float, top_k: int | None,
                  rng: np.random.Generator, write: Callable[[str], None], stop_at_eot: bool = True,
                  top_p: float | None = None) -> str:
    """Generate up to n tokens after prompt, handing each new piece of decoded text to `write`; returns it all.

    Byte-level BPE can split a character over tokens: text is written only up to the last whole character.
    """
    ids = tokenizer.encode(prompt or DEFAULT_PROMPT, add_special_tokens=False).ids or [0]
    eot, vocab = tokenizer.token_to_id(EOT), tokenizer.get_vocab_size()
    drawn: list[int] = []
    shown = [""]

    def on_token(token: int) -> bool:
        if stop_at_eot and token == eot:
            return False
        if token < vocab:
            drawn.append(int(token))
        text = tokenizer.decode(drawn)
        if not text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its next token
            write(text[len(shown[0]):])
            shown[0] = text
        return True

    backend.generate(np.asarray(ids, dtype=np.int32), n, temperature, top_k, rng, on_token=on_token, top_p=top_p)
    text = tokenizer.decode(drawn)
    if text != shown[0] and text.startswith(shown[0]):
        write(text[len(shown[0]):])
    return text


def sample_record(stats: SampleStats, block_size: int) -> dict:
    """The JSON fields of a sample's stats (`trainer sample --json`): tokens, seconds, tok/s, window refills."""
    return {"tokens": stats.tokens, "seconds": round(stats.seconds, 4),
            "tok_s": round(stats.tokens / stats.seconds, 1) if stats.seconds > 0 else None,
            "refills": stats.refills, "block_size": block_size}
