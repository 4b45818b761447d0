"""Database connection: URL resolution, engines, sessions, migrations.

Default: an SQLite file (``SCALEPLAN_DB`` env var, else ``<user data dir>/scaleplan/scaleplan.db``)
in WAL mode with a busy timeout, so several writers on one node do not fail. Teams pass
``postgresql+psycopg://user:pass@host/db`` (``--db`` or the env var) and get the same schema.
"""
from __future__ import annotations

import contextlib
import functools
import os
import random
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from scaleplan.errors import ScaleplanError, SpecError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.orm import Session

SQLITE_BUSY_TIMEOUT_MS = 30_000
T = TypeVar("T")


def default_url() -> str:
    """``SCALEPLAN_DB`` if set (a URL or a file path), else an SQLite file in the user data dir."""
    env = os.environ.get("SCALEPLAN_DB")
    if env:
        return env if "://" in env else f"sqlite:///{Path(env).expanduser().resolve()}"
    from platformdirs import user_data_dir

    d = Path(user_data_dir("scaleplan", appauthor=False))
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{d / 'scaleplan.db'}"


def resolve_url(url: str | None) -> str:
    """Normalise a ``--db`` value (URL or file path; None means the default). Raises SpecError."""
    if not url:
        url = default_url()
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:  # bytes of no UTF-8 text in argv arrive as lone surrogates
        raise SpecError("--db", url.encode("utf-8", "backslashreplace").decode(), "UTF-8 text") from None
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    if url.startswith("sqlite:///"):  # a file path: nothing to parse (and no SQLAlchemy import for a planner command)
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(url)
        u.port  # noqa: B018  (a non-numeric port raises here)
    except (ArgumentError, ValueError):
        raise SpecError("--db", mask_url(url), "an SQLAlchemy URL such as sqlite:///file.db or "
                        "postgresql+psycopg://user@host/db") from None
    if u.host and "@" in u.host:  # an unencoded '@' in the password: the rest would be taken as host
        raise SpecError("--db", mask_url(url), "percent-encode '@' in the password as %40")
    try:
        (u.host or "").encode("idna")  # what the driver's name lookup does first
    except UnicodeError as e:
        raise SpecError("--db", mask_url(url), f"a host name of dot-separated labels of 1-63 letters, digits or "
                        f"'-' ({e})") from None
    return url


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***, safe to print or log.

    A password with an unencoded '@' parses as password + host ('u:p@ss@h' -> host 'ss@h'); the part
    before the last '@' of such a host is password too, so it is masked as well.
    """
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
        if u.host and "@" in u.host:
            u = u.set(password="***", host=u.host.rsplit("@", 1)[1])
        return u.render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


@functools.lru_cache(maxsize=16)
def get_engine(url: str | None = None) -> Engine:
    """A (cached) engine for ``url``. SQLite files get WAL, busy timeout and foreign keys."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    url = resolve_url(url)
    try:
        if not url.startswith("sqlite"):
            return create_engine(url, pool_pre_ping=True)
        eng = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
    except (ArgumentError, ImportError, ValueError, TypeError) as e:  # unknown dialect, missing driver
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        extra = " (PostgreSQL needs the postgres extra: pip install 'scaleplan[postgres]')" \
            if isinstance(e, ImportError) else ""
        raise SpecError("--db", mask_url(url), f"cannot use this URL ({first}); use sqlite:///FILE or "
                        f"postgresql+psycopg://user@host/db{extra}") from None
    event.listen(eng, "connect", _sqlite_pragmas)
    path = make_url(url).database
    # a --db in a folder that does not exist is a typo far more often than a wish for a new folder: refuse it
    # rather than create it silently (default_url makes its own user-data folder)
    if path and path != ":memory:" and not Path(path).expanduser().parent.is_dir():
        raise SpecError("--db", mask_url(url), f"a file in an existing folder ({Path(path).parent} is not a "
                        "folder; create it first)")
    return eng


@contextlib.contextmanager
def session_scope(url: str | None = None) -> Iterator[Session]:
    """A transaction: commit on success, roll back on any exception."""
    from sqlalchemy.orm import sessionmaker

    sess = sessionmaker(get_engine(url), expire_on_commit=False)()
    try:
        yield sess
        sess.commit()
    except BaseException:
        sess.rollback()
        raise
    finally:
        sess.close()


def read_back(url: str | None, model: type, ids: list, key: str = "id") -> None:
    """Check that the rows of ``model`` (an ORM class) whose column ``key`` (default the primary key) holds
    each of ``ids`` are there for a new connection, outside this process's pool, before a command reports them
    stored: a commit that only this process's own connection can see (an SQLite log deleted under it by another
    process) would otherwise be reported and lost. Raises ScaleplanError naming the table and the missing keys."""
    from sqlalchemy import create_engine, select
    from sqlalchemy.pool import NullPool

    want = list(dict.fromkeys(i for i in ids if i is not None))
    if not want:
        return
    col = getattr(model, key)
    eng = create_engine(resolve_url(url), poolclass=NullPool)
    found: set = set()
    try:
        with eng.connect() as conn:
            for i in range(0, len(want), 500):
                found.update(conn.execute(select(col).where(col.in_(want[i:i + 500]))).scalars())
    finally:
        eng.dispose()
    missing = [i for i in want if i not in found]
    if missing:
        shown = missing if len(missing) <= 5 else [*missing[:5], f"... {len(missing)} in all"]
        raise ScaleplanError(f"{model.__tablename__} rows {shown} ({key}) were committed but a new connection does "
                             f"not see them in {mask_url(resolve_url(url))}; they are not stored")


def with_retry(fn: Callable[[], T], attempts: int = 8, base_delay_s: float = 0.05) -> T:
    """Run ``fn`` retrying transient lock/serialization errors with jittered exponential backoff.

    SQLite's busy timeout handles most contention; this covers the rest (a writer that begins a
    transaction before another commits, PostgreSQL serialization failures).
    """
    from sqlalchemy.exc import OperationalError

    for i in range(attempts):
        try:
            return fn()
        except OperationalError as e:
            msg = str(e.orig).lower() if e.orig else str(e).lower()
            transient = "locked" in msg or "busy" in msg or "serializ" in msg or "deadlock" in msg
            if not transient or i == attempts - 1:
                raise
            time.sleep(base_delay_s * (2**i) * (0.5 + random.random()))
    raise AssertionError("unreachable")


# --- migrations --------------------------------------------------------------------------------

def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("scaleplan.db_migrations")))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["engine"] = get_engine(url)
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> str:
    """Apply migrations up to ``revision``; return the resulting revision id."""
    from alembic import command

    url = resolve_url(url)
    command.upgrade(alembic_config(url), revision)
    return current_revision(url) or "base"


def downgrade(url: str | None = None, revision: str = "base") -> str:
    from alembic import command

    url = resolve_url(url)
    command.downgrade(alembic_config(url), revision)
    return current_revision(url) or "base"


def current_revision(url: str | None = None) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with get_engine(resolve_url(url)).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def ensure_schema(url: str | None = None) -> None:
    """Upgrade to head if the database is not there yet (first use creates the schema)."""
    from sqlalchemy.exc import OperationalError

    url = resolve_url(url)
    try:
        if current_revision(url) != head_revision():
            upgrade(url)
    except OperationalError as e:
        raise ScaleplanError(f"cannot open database {mask_url(url)}: {str(e.orig).splitlines()[0]}") from None


def table_names(url: str | None = None) -> list[str]:
    from sqlalchemy import inspect

    return sorted(inspect(get_engine(resolve_url(url))).get_table_names())
