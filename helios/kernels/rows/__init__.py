"""Row families: one worker per row of the last axis (helios.kernels.lib.row_workers): softmax, the norms, fused
cross-entropy, and the reductions."""
