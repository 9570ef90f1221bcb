"""GGUF files: opening them, their header index, and ggml's quantized block types as houchu's int4 groups."""
