"""Benchmarks against PyTorch/cuDNN: ``python -m dnnprims.bench [conv|memory|rnn|all]``."""
