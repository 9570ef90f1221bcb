"""Parsing a client request: the body decoded and checked, its parts converted, and the validated request the engine receives."""
