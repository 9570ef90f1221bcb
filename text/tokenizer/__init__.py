"""The model's tokenizer: loading it from a GGUF or a Hugging Face directory, the converted cache, and its errors."""
