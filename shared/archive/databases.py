"""The two databases the archive runs on, behind what differs between them.

* :class:`Postgres`: psycopg 3 with a connection pool (``psycopg_pool``), for deployments; bulk
  rows go in with ``COPY``. A connection is checked before use, so a restarted server costs one
  failed batch at most, and the first read once a server that was down is back connects;
  connections idle for a minute are closed.
* :class:`Sqlite`: the standard library's ``sqlite3`` on one file (WAL, so readers do not wait for
  the writer), for the embedded mode and single-host use; one connection per process, serialised.

Both raise :class:`~shared.errors.ArchiveUnavailable` when the database cannot be used.

A run's JSON may hold NUL (U+0000) in any string (its input, answer, metadata, a tool's output):
JSON writes it as the escape ``\\u0000``. The archive stores that text as it is (``json`` in
PostgreSQL, text in SQLite), but PostgreSQL's ``jsonb`` and JSON path functions refuse the escape
(``unsupported Unicode escape sequence``) and SQLite's cut a string at it. So a listing's filter on a
value inside the JSON (:meth:`Database.json_string_is`) reads the document through
:func:`json_safe_text` and compares with :func:`json_safe_string` of the value: NUL and U+0001 as
two characters each, one to one, so a filter matches exactly the documents holding its value and
no document fails the query.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from shared.errors import ArchiveUnavailable, ConfigError
from shared.settings import redact_url

__all__ = [
    "Cursor",
    "Database",
    "Postgres",
    "Sqlite",
    "json_safe_string",
    "json_safe_text",
    "open_database",
    "sqlite_path",
]

#: Any number, the same for every process: PostgreSQL's advisory lock id of schema migrations.
_MIGRATION_LOCK = 0x57E51C4A
#: The longest a transaction on the PostgreSQL archive may go on (a read, an archiver's batch, a
#: migration's step), in multiples of its ``timeout_s``: past it, its connection is cut.
_TRANSACTION_TIMEOUTS = 6
#: PostgreSQL's SQLSTATE of a lock not granted within ``lock_timeout``.
_LOCK_NOT_AVAILABLE = "55P03"


#: In JSON text, the escape of NUL or of U+0001 (``\u0000``, ``\u0001``) where it is an escape: after
#: an even run of backslashes (``\\u0000`` is a backslash and the text ``u0000``). The same pattern
#: serves PostgreSQL (its regular expressions have lookbehinds) and Python.
_NUL_OR_ONE = r"(?<!\\)((?:\\\\)*)\\u000([01])"
#: ... replaced by the escape of U+0001 and the digit it was: U+0000 -> U+0001 "0", U+0001 -> U+0001 "1".
_NUL_OR_ONE_SAFE = r"\1\\u0001\2"
_NUL_OR_ONE_RE = re.compile(_NUL_OR_ONE)
_NUL_OR_ONE_CHAR = re.compile("[\x00\x01]")


def json_safe_text(text: str) -> str:
    """JSON ``text`` whose strings hold no NUL: each NUL written U+0001 ``0``, each U+0001 written
    U+0001 ``1`` (one to one). Text without either escape is returned as it is."""
    if "\\u000" not in text:
        return text
    return _NUL_OR_ONE_RE.sub(_NUL_OR_ONE_SAFE, text)


def json_safe_string(value: str) -> str:
    """``value`` as it reads in a document after :func:`json_safe_text`."""
    if "\x00" not in value and "\x01" not in value:
        return value
    return _NUL_OR_ONE_CHAR.sub(lambda m: "\x01" + str(ord(m.group())), value)


class Cursor(Protocol):
    """The DB-API cursor both drivers give (only what the archive uses)."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...

    def executemany(self, query: Any, params_seq: Any, /) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Database(ABC):
    """Connections, placeholders and column types of one database."""

    kind: str
    json_type: str
    float_type: str

    @abstractmethod
    @contextmanager
    def transaction(self, exclusive: bool = False) -> Iterator[Cursor]:
        """A cursor in a transaction, committed when the block ends, rolled back if it raises.

        ``exclusive`` serialises the transaction against every other exclusive one (migrations).
        """

    @abstractmethod
    def sql(self, query: str) -> str:
        """``query`` written with ``?`` placeholders, in this driver's placeholders."""

    @abstractmethod
    def any_of(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        """A condition that ``column`` is one of ``values``, and its parameters."""

    def json_text(self, column: str) -> str:
        """``column`` (a JSON column) selected as text."""
        return column

    @abstractmethod
    def json_member(self, column: str, name: str) -> str:
        """The member ``name`` (a plain identifier) of the JSON object in ``column``, as text (NULL
        where it has none), for a statement without parameters. The document is read through
        :func:`json_safe_text` where that matters (a NUL elsewhere in it must not fail the read)."""

    @abstractmethod
    def json_string_is(self, column: str, path: Sequence[str], value: str) -> tuple[str, list[Any]]:
        """A condition: the JSON ``column`` holds the string ``value`` at ``path`` (object keys);
        a number or any other type there never matches. The condition and its parameters.

        The document is read through :func:`json_safe_text` (a NUL anywhere in it must not fail
        the query, nor cut a string short), so the path and value are compared as
        :func:`json_safe_string` writes them."""

    @abstractmethod
    def insert_many(self, cur: Cursor, table: str, width: int, rows: list[tuple[Any, ...]]) -> None:
        """Insert ``rows`` into ``table`` (``name (columns)``) in bulk."""

    @abstractmethod
    def close(self) -> None: ...


class Sqlite(Database):
    kind = "sqlite"
    json_type = "TEXT"
    float_type = "REAL"

    def __init__(self, path: str) -> None:
        self.path = path
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.create_function("wesichain_json_safe", 1, json_safe_text, deterministic=True)
        except sqlite3.Error as exc:
            raise ArchiveUnavailable(f"cannot open the SQLite archive {path}: {exc}") from None
        self._lock = threading.Lock()

    @contextmanager
    def transaction(self, exclusive: bool = False) -> Iterator[Cursor]:
        with self._lock:
            cur = self._conn.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE" if exclusive else "BEGIN")
                yield cur
                cur.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise ArchiveUnavailable(f"the SQLite archive {self.path} failed: {exc}") from exc
            except BaseException:
                self._rollback()
                raise
            finally:
                cur.close()

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def sql(self, query: str) -> str:
        return query

    def any_of(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        return f"{column} IN ({', '.join('?' * len(values))})", list(values)

    def json_member(self, column: str, name: str) -> str:
        return f"json_extract({column}, '$.{name}')"

    def json_string_is(self, column: str, path: Sequence[str], value: str) -> tuple[str, list[Any]]:
        # json_type tells a string ('text') from a number whose text would compare equal.
        where = "$" + "".join(f'."{json_safe_string(key)}"' for key in path)
        doc = f"wesichain_json_safe({column})"
        return (
            f"(json_type({doc}, ?) = 'text' AND json_extract({doc}, ?) = ?)",
            [where, where, json_safe_string(value)],
        )

    def insert_many(self, cur: Cursor, table: str, width: int, rows: list[tuple[Any, ...]]) -> None:
        cur.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * width)})", rows)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _server_bounds(url: str, timeout_s: float) -> str:
    """The connection's ``options``: the URL's own, then bounds PostgreSQL keeps on the session
    itself. A process whose host vanishes (or whose path to the server freezes) mid-transaction
    leaves the server a connection that is open and silent, its transaction idle, holding its locks
    (the schema lock of a migration, the rows of an archiver's batch) until the kernel gives the
    connection up, many minutes later. The server ends such a transaction once it has been idle
    for as long as the archive lets a transaction last (the client cuts its own then too), and a
    connection whose sent data goes unacknowledged as long."""
    import psycopg.conninfo

    bound_ms = int(timeout_s * _TRANSACTION_TIMEOUTS * 1000)
    own = psycopg.conninfo.conninfo_to_dict(url).get("options") or ""
    bounds = f"-c idle_in_transaction_session_timeout={bound_ms} -c tcp_user_timeout={bound_ms}"
    return f"{own} {bounds}".strip()


class Postgres(Database):
    kind = "postgresql"
    json_type = "JSON"
    float_type = "DOUBLE PRECISION"

    def __init__(self, url: str, *, max_connections: int = 4, timeout_s: float = 5.0) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise ConfigError(
                "a PostgreSQL archive needs psycopg 3 and psycopg_pool: pip install 'wesichain[postgres]'"
            ) from None
        self._errors: tuple[type[BaseException], ...] = (psycopg.Error, _pool_errors())
        self.url = redact_url(url)
        self.timeout_s = timeout_s
        # No connection kept open while idle: every process of a deployment (each prefork child,
        # each API worker) may read archived runs, most of them rarely.
        self._pool = ConnectionPool(
            url,
            min_size=0,
            max_size=max_connections,
            max_idle=60,
            timeout=timeout_s,
            # A failed connect is retried with a doubling pause until this runs out, and only then
            # may a reader start another. At the pool's default (5 minutes) a database that was
            # down for a minute stayed unread for about a minute more, every reader waiting on an
            # attempt asleep in its pause: an attempt ends well within the time a reader waits, so
            # the first read after the database is back connects.
            reconnect_timeout=timeout_s / 2,
            open=True,
            check=self._check,
            kwargs={"connect_timeout": max(1, int(timeout_s)), "options": _server_bounds(url, timeout_s)},
            name="wesichain-archive",
        )

    def _check(self, conn: Any) -> None:
        """The pool's check of a connection it hands out, given up on after ``timeout_s``."""
        from psycopg_pool import ConnectionPool

        with _cut_after(conn, self.timeout_s):
            ConnectionPool.check_connection(conn)

    @contextmanager
    def transaction(self, exclusive: bool = False) -> Iterator[Cursor]:
        """A transaction on a pooled connection. A database that stops answering (a partition that
        leaves the connection open but silent, a hung server) neither refuses nor resets it: the
        pool's check of the connection is cut after ``timeout_s``, and the transaction after
        ``_TRANSACTION_TIMEOUTS`` times that, so the caller gets :class:`ArchiveUnavailable`
        instead of waiting for the kernel to give the connection up (many minutes)."""
        locking = False
        try:
            with (
                self._pool.connection() as conn,
                _cut_after(conn, self.timeout_s * _TRANSACTION_TIMEOUTS),
                conn.cursor() as cur,
            ):
                if exclusive:
                    # Waited for as long as a connection is, not without end: the process holding
                    # it may be applying a long migration, or be gone without its connection
                    # noticing yet. Every process takes it on its first use of the archive, so an
                    # unbounded wait hung each of them (an API process's every worker thread, one
                    # read of an archived run after another) until the holder let go. The
                    # migration's own statements then wait for their locks as configured.
                    cur.execute(
                        "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
                        (f"{int(self.timeout_s * 1000)}ms",),
                    )
                    row = cur.fetchone()
                    locking = True
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                    locking = False
                    cur.execute("SELECT set_config('lock_timeout', %s, true)", (row[0] if row else "0",))
                yield cur
        except self._errors as exc:
            if locking and getattr(exc, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
                raise ArchiveUnavailable(
                    f"the PostgreSQL archive at {self.url} is being migrated by another process"
                    f" (its schema lock was not free within {self.timeout_s:g} s): try again"
                ) from exc
            raise ArchiveUnavailable(
                f"the PostgreSQL archive at {self.url} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def sql(self, query: str) -> str:
        return query.replace("?", "%s")

    def any_of(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        return f"{column} = ANY(%s)", [list(values)]

    def json_text(self, column: str) -> str:
        return f"{column}::text"

    def json_member(self, column: str, name: str) -> str:
        # Read through json_safe_text: PostgreSQL refuses to turn a document holding the escape of
        # NUL anywhere into text or jsonb, whichever member is asked for. The backslashes are in
        # escape strings (E'...'), which read the same whatever standard_conforming_strings is.
        doc = _json_safe_document(column, *(_escaped(text) for text in _JSON_SAFE_OPERANDS))
        return f"({doc}->>'{name}')"

    def json_string_is(self, column: str, path: Sequence[str], value: str) -> tuple[str, list[Any]]:
        # jsonb equality (the column may be json): a string equals only a string (to_jsonb keeps the type).
        doc = _json_safe_document(column, "?::text", "?::text", "?::text")
        marks = ", ".join("?::text" for _ in path)
        safe = [json_safe_string(key) for key in path]
        return (
            f"jsonb_extract_path({doc}, {marks}) = to_jsonb(?::text)",
            [*_JSON_SAFE_OPERANDS, *safe, json_safe_string(value)],
        )

    def insert_many(self, cur: Cursor, table: str, width: int, rows: list[tuple[Any, ...]]) -> None:
        with cur.copy(f"COPY {table} FROM STDIN") as copy:  # type: ignore[attr-defined]
            for row in rows:
                copy.write_row(row)

    def close(self) -> None:
        self._pool.close()


#: The text of :func:`_json_safe_document`'s three operands: the escape it looks for, the pattern of
#: the escapes it rewrites, and what it rewrites them to.
_JSON_SAFE_OPERANDS = ("\\u000", _NUL_OR_ONE, _NUL_OR_ONE_SAFE)


def _json_safe_document(column: str, escape: str, pattern: str, safe: str) -> str:
    """PostgreSQL's jsonb of the JSON ``column`` as :func:`json_safe_text` writes it, given its three
    operands (:data:`_JSON_SAFE_OPERANDS`) as SQL: placeholders or constants. Only a document with
    an escape of NUL or U+0001 is rewritten (the regular expression's cost)."""
    return (
        f"(CASE WHEN strpos({column}::text, {escape}) = 0 THEN {column}::jsonb"
        f" ELSE regexp_replace({column}::text, {pattern}, {safe}, 'g')::jsonb END)"
    )


def _escaped(text: str) -> str:
    """``text`` as a PostgreSQL escape string constant (``E'...'``)."""
    return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


@contextmanager
def _cut_after(conn: Any, seconds: float) -> Iterator[None]:
    """Shut ``conn``'s socket down if the block has not ended within ``seconds``: a statement
    waiting for an answer that is not coming then fails at once (OperationalError), and the pool
    drops the connection."""

    def cut() -> None:
        with contextlib.suppress(OSError, ValueError):
            fd = conn.pgconn.socket
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(seconds, cut)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _pool_errors() -> type[BaseException]:
    from psycopg_pool import PoolTimeout

    return PoolTimeout


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:///relative`` or ``sqlite:////absolute`` URL (``sqlite:///:memory:``)."""
    rest = url[len("sqlite://") :]
    if not rest.startswith("/") or len(rest) < 2:
        raise ConfigError(f"a SQLite archive URL is sqlite:///PATH, got {url!r}")
    return rest[1:]


def open_database(url: str) -> Database:
    """The database of an archive URL (``postgresql://...`` or ``sqlite:///PATH``)."""
    scheme = urlsplit(url).scheme
    if scheme in ("postgresql", "postgres"):
        return Postgres(url)
    if scheme == "sqlite":
        return Sqlite(sqlite_path(url))
    raise ConfigError(f"an archive URL starts with postgresql:// or sqlite:///, got {redact_url(url)!r}")
