"""Tests of helios/kernels/rows/."""
