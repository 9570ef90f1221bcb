"""The wire contract between houchu's actors: msgspec messages, typed ZeroMQ channels, the receive loop, endpoints."""
