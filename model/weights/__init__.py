"""Loading a model's weights from a GGUF file or a Hugging Face directory: shapes checked, tensor-parallel shards cut before dequantizing."""
