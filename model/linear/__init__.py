"""Linear layers: dense, weight-only int4 / int8, and W8A8, and the factory that picks one per weight."""
