"""The OpenAI-compatible HTTP API: its routes, response shapes, logprobs bodies and several choices per request."""
