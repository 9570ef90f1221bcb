"""The live dashboard: its pages, JSON feed and lever catalog (read from the database and the engine's counters)."""
