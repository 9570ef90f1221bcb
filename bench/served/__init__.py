"""Benchmarks through the API of a served engine: speculation, structured output, the
scheduler levers, replicas, parallel sampling, the overlap scheduler, KV tiers, the token
path and the quick comparison with Hugging Face ``generate()``; each starts its servers."""
