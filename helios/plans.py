"""Plans a captured step reads from fixed device buffers, rewritten by the caller for each batch: the public home
of what crosses from the kernels into the trainer's step capture (trainer/backends/step_capture.py, docs/REPLAY.md).

- `FixedScatterPlan(n_tokens, vocab)`: the embedding backward's sorted-scatter plan in fixed tensors; `plan` is
  what embedding_backward takes (through autograd.host_inputs.HostInputs.scatter_plan), `arrays(ids)` the values
  to write into `tensors` before each replay.
"""

from __future__ import annotations

from helios.kernels.indexing.embedding import FixedScatterPlan

__all__ = ["FixedScatterPlan"]
