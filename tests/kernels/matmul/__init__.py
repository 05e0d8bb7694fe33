"""Tests of helios/kernels/matmul/."""
