"""Backend implementations: `helios` (Vulkan compute) and `torch_ref` (CPU reference).

Importing this package imports each backend module, whose Backend subclass registers its `name` as it is
defined (trainer.backend): that is how the trainer finds them. A new backend is one module here plus its
line below. The other modules are helpers their backend imports (torch_model loads torch, which finding
the backends must not).
"""

from trainer.backends import helios, torch_ref  # noqa: F401 (imported for their registrations)
