"""A model's configuration: the architecture numbers read from a Hugging Face ``config.json`` or a GGUF's metadata, and the block structure of each family."""
