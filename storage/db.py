"""Connecting to the database and migrating its schema.

The default database is SQLite in WAL mode at ``houchu.paths.cache_dir()/houchu.db``
(readers never wait for the recorder's writes); ``--db-url`` takes any SQLAlchemy URL
(``postgresql+psycopg://...``, ``sqlite:////abs/path.db``, ...). The schema is created
and upgraded by Alembic with the migrations shipped in ``houchu/storage/migrations``.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool

from houchu.paths import cache_dir

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
#: Seconds a connection waits for a SQLite write lock before failing.
SQLITE_BUSY_TIMEOUT_S = 10.0


class DatabaseUrlError(ValueError):
    """A database URL that SQLAlchemy cannot parse or has no driver for."""


def default_url() -> str:
    """``sqlite:///CACHE_DIR/houchu.db`` (see ``houchu.paths.cache_dir``)."""
    return f"sqlite:///{cache_dir() / 'houchu.db'}"


def resolve_url(url: str | None) -> str:
    """``url``, or the default database when it is None or empty.

    Raises:
        DatabaseUrlError: ``url`` is not a SQLAlchemy URL.
    """
    if not url:
        return default_url()
    parse_url(url)
    return url


def parse_url(url: str) -> URL:
    """Parse a SQLAlchemy URL. Raises DatabaseUrlError with the reason."""
    try:
        return make_url(url)
    except (ArgumentError, ValueError) as e:
        raise DatabaseUrlError(f"not a database URL ({url!r}): {e}") from None


def redact(url: str) -> str:
    """``url`` with any password hidden, for logs."""
    return parse_url(url).render_as_string(hide_password=True)


def _is_sqlite_memory(u: URL) -> bool:
    return u.get_backend_name() == "sqlite" and u.database in (None, "", ":memory:")


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL, or None (another database, or in memory)."""
    u = parse_url(url)
    if u.get_backend_name() != "sqlite" or _is_sqlite_memory(u):
        return None
    return Path(u.database)


def create_db_engine(url: str) -> Engine:
    """An Engine for ``url``; SQLite files get WAL mode and a busy timeout.

    The parent folder of a SQLite file is created. Raises DatabaseUrlError for a bad URL
    or a missing driver.
    """
    u = parse_url(url)
    kwargs: dict = {}
    if u.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}
        if _is_sqlite_memory(u):
            kwargs["poolclass"] = StaticPool  # one shared in-memory database
        else:
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    try:
        engine = create_engine(u, **kwargs)
    except (ArgumentError, ImportError) as e:
        raise DatabaseUrlError(f"cannot use database {redact(url)}: {e}") from None
    if u.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas(not _is_sqlite_memory(u)))
    return engine


def _sqlite_pragmas(wal: bool):
    def on_connect(dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        if wal:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cur.close()

    return on_connect


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """Serialize migrations of one SQLite file across processes (a file lock)."""
    path = sqlite_path(engine.url.render_as_string(hide_password=False))
    if path is None:
        yield
        return
    lock = path.expanduser().with_name(path.name + ".migrate-lock")
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _alembic_config():
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def migrate(engine: Engine, revision: str = "head") -> None:
    """Create or upgrade the schema to ``revision`` (Alembic; from an empty database too).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database refused a migration step.
    """
    from alembic import command

    cfg = _alembic_config()
    with _migration_lock(engine), engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Downgrade the schema to ``revision`` ("base": drop every table). Raises
    ``sqlalchemy.exc.SQLAlchemyError`` if the database refuses."""
    from alembic import command

    cfg = _alembic_config()
    with _migration_lock(engine), engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def schema_revision(engine: Engine) -> str | None:
    """The schema revision the database is at, or None before the first migration."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    """The newest revision the shipped migrations define."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def has_schema(engine: Engine) -> bool:
    """Whether the database has houchu's tables (it was migrated at least once)."""
    return inspect(engine).has_table("requests")


def open_db(url: str | None, *, migrate_schema: bool = True) -> Engine:
    """Connect to ``url`` (default database when None) and migrate it to the newest schema.

    Raises:
        DatabaseUrlError: a bad URL or a missing driver.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be reached or migrated.
    """
    engine = create_db_engine(resolve_url(url))
    if migrate_schema:
        migrate(engine)
    return engine
