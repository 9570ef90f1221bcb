"""Benchmarks of architectures on random weights (families, MLA, MTP, tensor parallel and its
memory): developer tools, run from a checkout (``python -m houchu.devtools.bench.mla``)."""
