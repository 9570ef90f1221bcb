"""Storage: the only code that talks to the database (SQLAlchemy; SQLite by default).

- ``db``: URLs, engines (SQLite in WAL mode), Alembic migrations.
- ``models``: the tables.
- ``ingest`` / ``writer`` / ``retention``: the recorder's write path (in a thread).
- ``requests_view`` / ``ledger_view`` / ``live_view`` / ``timeline``: the dashboard's reads.
- ``bench_runs``: ``save_bench_run`` for the load generator.
"""
