"""The shared kernel library: SPIR-V building blocks that more than one family uses (elementwise maps, row workers,
wide loads, the counter-based RNG, cooperative-matrix needs). No op is declared here but the RNG's own `rand`."""
