"""The request and response bodies of the HTTP and WebSocket APIs as msgspec types, and a decode error as the client's 400."""
