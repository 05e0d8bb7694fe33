"""Pointwise families: each output element from the same-index elements of its inputs (arithmetic, activations,
fused swiglu / residual dropout, casts, dropout) or from a fixed pair of them (rope's rotation)."""
