"""The KV cache's bookkeeping: the page allocator, the radix tree of cached prefixes, and the host and SSD tiers."""
