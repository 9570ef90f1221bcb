"""Tool calls in a model's output: parsed whole or as the reply streams."""
