"""Fused one-token decode kernels (inference only): a token of a GPT-2-style model in n_layer + 1 dispatches.

autograd/nn/decode.py's one-token steps spent most of their device time on dispatches, not arithmetic (a dispatch
costs ~27 us on lavapipe even when it does nothing, and a token took 31). Here one dispatch of ONE workgroup runs
a whole transformer block for the new row (block.py: the first block's token embedding, ln_1, the QKV projection
written into the KV cache row, causal attention over the cached rows, proj + residual, ln_2, fc + gelu, proj +
residual; intermediates in shared memory, workgroup barriers between phases: Vulkan gives no forward-progress
guarantee between workgroups, so the block is never split over them), and one dispatch of many workgroups computes
ln_f and the LM-head GEMV (head.py). select.py holds the selection rules: "decode", which configs and devices take
the fused path (GPT-2 blocks in f32 whose kernels fit the device; everything else runs the unfused path unchanged),
and "decode_kernels", which variant of the kernels runs."""
