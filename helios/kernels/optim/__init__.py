"""The optimiser's device side: fused multi-tensor AdamW with the global gradient norm and clip, and dynamic loss
scaling for fp16 (both decided on the device, no host read)."""
