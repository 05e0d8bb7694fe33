"""Tests of helios/kernels/optim/."""
