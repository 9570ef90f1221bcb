"""Triton kernels of the model runner (GPU; tested on the CPU under ``TRITON_INTERPRET=1``)."""
