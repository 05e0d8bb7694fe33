"""The helios trainer: config, data, the Backend contract, the training loop, checkpoints and the CLI.

Nothing here needs torch: the PyTorch reference backend is imported only when asked for.
"""
