"""Benchmarks of the model runner in one process: decode and prefill per weight format, families, MLA, MoE, MTP, quantization quality, sampler, tensor parallel."""
