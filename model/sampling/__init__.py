"""Sampling: the batched sampler, its warpers, per-request logits processors, prompt log-probabilities and speculative verification."""
