"""The gateway's HTTP (OpenAI-compatible) and WebSocket APIs: schema, validation, errors, limits, metrics and the engine client."""
