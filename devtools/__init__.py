"""Developer tools that are not part of the installed package: test fixtures (tiny random
and trained models, GGUF writers), the GPU machine's check (``python3 devtools/gpu_check.py``)
and the benchmarks of architectures on random weights. They live in a checkout only:
``pyproject.toml`` installs every package but this one, and no installed module imports it
(``tests/test_layout.py``)."""
