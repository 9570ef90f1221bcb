"""Tensor parallelism inside the runner: the shards each rank keeps, the ``torch.distributed`` group, and the worker processes of ranks 1..N-1."""
