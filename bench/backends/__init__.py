"""The load generator's targets: the interface, Hugging Face ``generate()``, any OpenAI-compatible server, and houchu's WebSocket API."""
