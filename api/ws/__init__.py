"""The streaming WebSocket API: its route, error-frame ids and requests in flight."""
