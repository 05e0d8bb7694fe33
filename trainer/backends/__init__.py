"""Backend implementations: `torch_ref` (CPU reference) and `helios` (Vulkan compute)."""
