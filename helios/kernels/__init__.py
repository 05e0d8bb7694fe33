"""One file per op family: numpy reference, SPIR-V builders, variants, grids, op functions."""
