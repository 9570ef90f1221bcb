"""The load generator (``houchu bench``), the comparisons with other engines, and the runner benchmarks."""
