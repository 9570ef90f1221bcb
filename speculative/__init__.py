"""Speculative decoding (the "break serial" lever): proposers for the draft actor, and the
scheduler's bookkeeping of proposals, verification results and adaptive speculation.

- ``ngram``, ``proposers``, ``draft_model``: what the draft actor runs (n-gram prompt
  lookup, or a draft model with its own paged KV);
- ``state``, ``scheduling``, ``adaptive``, ``ledger``, ``calibrate``: the scheduler's side
  (which requests speculate with how many tokens, applying accepted runs, counters).

Verification itself runs in the model runner (``houchu.model.sampling.verify``).
"""
