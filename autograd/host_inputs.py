"""Host copies of a step's integer inputs, handed to the model explicitly (never hung on tensors)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HostInputs:
    """What the host already knows about a step's token ids, so ops can plan on the host what they would
    otherwise work out on the device: the embedding backward's deterministic scatter plan (bit-reproducible
    training) and the chunked loss's per-chunk row weights.

    ids / targets: the host arrays the token ids and targets were uploaded from (None: not known).
    scatter_plan: a captured step's FixedScatterPlan, the ids' scatter plan in fixed device tensors that are
    rewritten before each replay (None: planned from `ids` on the host).
    """

    ids: np.ndarray | None = None
    targets: np.ndarray | None = None
    scatter_plan: object | None = None

