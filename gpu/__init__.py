"""The CUDA device: Triton kernels, the FlashAttention and Triton attention backends, CUDA graphs and GPU memory sizing."""
