"""Tests of helios/kernels/attention/."""
