"""Tests of helios/kernels/indexing/."""
