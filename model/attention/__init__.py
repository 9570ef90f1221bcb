"""Attention over the paged KV cache: the backend interface, its per-step metadata, the portable torch backend, per-layer windows, and multi-head latent attention."""
