"""What the device can do at all, measured through the runtime: the FMA-throughput and copy-bandwidth kernels
(kernels.py) and the FLOP peak that MFU is read against (peak.py: a vendor figure, a stored measurement, or one
taken now). Above the runtime and the kernels' layers, below the bench and the trainer, which both read it."""
