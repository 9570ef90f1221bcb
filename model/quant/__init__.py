"""Quantization math: int4 / int8 grids, GPTQ, error-minimising int4 groups, calibration text, and the quality measure of a lossy lever."""
