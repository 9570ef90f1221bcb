"""The model runner: model definitions, weight loading, quantized linears, attention backends, sampling and the CPU / Triton kernels."""
