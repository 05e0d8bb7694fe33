"""Tests of helios/kernels/pointwise/."""
