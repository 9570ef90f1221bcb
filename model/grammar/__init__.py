"""Structured output in the runner: grammar matchers and their token bitmasks, the grammar worker, and jump-forward."""
