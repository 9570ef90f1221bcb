"""One thin module per actor, the launcher and supervisor, and ``ServeConfig``."""
