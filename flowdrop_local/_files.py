"""Creating and removing the files a store writes: private, exclusive, never through a link.

A database holds every conversation, so the library creates each file it writes
(the database itself, a backup) with mode 0600 before SQLite opens it; SQLite
gives the ``-wal``, ``-shm`` and ``-journal`` files the mode of their database.
Creation is exclusive and does not follow a symbolic link, so a file or a
dangling link planted at the path is never written through or overwritten.

A symbolic link at a database path (or at its ``-wal``, ``-shm`` or ``-journal``)
is refused on every open, :class:`~flowdrop_local.errors.SymlinkRefused`: SQLite
would resolve it and write the file it names (creating it with the umask's mode,
not 0600, if the link dangles). Only the last part of the path is looked at: a
folder on the way may be a link (``/tmp`` on macOS is one).

A libpq keyword/value string (``"dbname=chat host=localhost"``) given as a path is
refused as well (:func:`refuse_connection_string`), rather than becoming a file of
that name: PostgreSQL is given as a ``postgresql://`` URL.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import stat

from .errors import (
    DatabaseNotFound,
    FlowdropError,
    InvalidArgument,
    SymlinkRefused,
    has_lone_surrogate,
    shown,
)

PRIVATE_MODE = 0o600
SIDECARS = ("-wal", "-shm", "-journal")
_CREATE_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def checked_path(path: object, what: str) -> str:
    """``path`` as a str, or InvalidArgument naming ``what`` (a number, bytes, a NUL, a
    libpq keyword/value string)."""
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgument(
            f"{what} must be a path (str or os.PathLike), not {type(path).__name__}"
        )
    text = os.fspath(path)
    if not isinstance(text, str):
        raise InvalidArgument(f"{what} must be a text path, not {type(text).__name__}")
    if not text or "\x00" in text:
        raise InvalidArgument(f"{what} must be a non-empty path without NUL characters: {text!r}")
    if has_lone_surrogate(text):  # an undecodable byte: no file system call takes it
        raise InvalidArgument(
            f"{what} {shown(text)} holds a lone surrogate (a byte that is not UTF-8); "
            "give the path as valid text"
        )
    refuse_connection_string(text, what)
    return text


# libpq's connection keywords (PostgreSQL 18, "Parameter Key Words").
_LIBPQ_KEYWORDS = frozenset(
    """host hostaddr port dbname user password passfile require_auth channel_binding
    connect_timeout client_encoding options application_name fallback_application_name
    keepalives keepalives_idle keepalives_interval keepalives_count tcp_user_timeout
    replication gssencmode sslmode sslnegotiation requiressl sslcompression sslcert
    sslkey sslkeylogfile sslpassword sslcertmode sslrootcert sslcrl sslcrldir sslsni
    requirepeer ssl_min_protocol_version ssl_max_protocol_version min_protocol_version
    max_protocol_version krbsrvname gsslib gssdelegation service target_session_attrs
    load_balance_hosts oauth_issuer oauth_client_id oauth_client_secret oauth_scope""".split()  # noqa: SIM905
)
# One ``keyword = value`` of a libpq string: a value is single-quoted (backslash
# escapes) or a run of characters without white space.
_CONNINFO_PAIR = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*(?:'(?:[^'\\]|\\.)*'|(?:[^\s'\\]|\\.)+)\s*")


def refuse_connection_string(text: str, what: str) -> None:
    """Raise InvalidArgument when ``text`` reads as a libpq keyword/value string.

    That is: nothing but ``keyword=value`` pairs, one keyword at least being libpq's.
    The message names the keywords only: a value may be a password.
    """
    keywords: list[str] = []
    at = 0
    while at < len(text):
        pair = _CONNINFO_PAIR.match(text, at)
        if pair is None:
            return
        keywords.append(pair.group(1))
        at = pair.end()
    if not _LIBPQ_KEYWORDS.intersection(keywords):
        return
    shown = " ".join(keyword + "=..." for keyword in keywords)
    raise InvalidArgument(
        f"{what} '{shown}' reads as a PostgreSQL keyword/value connection string, "
        "not a file name: give PostgreSQL as a "
        "postgresql:// URL (postgresql://USER@HOST:PORT/DBNAME?sslmode=...), and a file "
        "of such a name with ./ before it"
    )


def refuse_link(path: str) -> None:
    """Raise SymlinkRefused when ``path``, or its -wal, -shm or -journal, is a symbolic link.

    SQLite refuses a linked sidecar itself, but with a message that reads as a
    corrupt file; a link at the database path it follows.
    """
    for name in (path, *(path + suffix for suffix in SIDECARS)):
        try:
            mode = os.lstat(name).st_mode
        except OSError:  # missing (or a folder on the way is not one): the open says so
            continue
        if stat.S_ISLNK(mode):
            raise SymlinkRefused(
                f"{name} is a symbolic link (to {os.readlink(name)}); flowdrop_local never "
                "opens a database through a link, which would write the file it names: "
                "give the path of the file itself"
            )


def folder_of(path: str) -> str:
    """The folder a file at ``path`` lives (or would live) in."""
    return os.path.dirname(os.path.abspath(path))


def require_folder(path: str) -> None:
    """Raise DatabaseNotFound when the folder ``path`` should be in does not exist."""
    folder = folder_of(path)
    if not os.path.isdir(folder):
        raise DatabaseNotFound(f"{path}: the folder {folder} does not exist")


def create_private(path: str) -> int:
    """Create ``path`` empty with mode 0600 and return its open descriptor.

    Exclusive and without following a link: raises FileExistsError when anything,
    a dangling symbolic link included, is already at ``path``. The umask can only
    narrow the mode.
    """
    return os.open(path, _CREATE_FLAGS, PRIVATE_MODE)


def open_or_create(path: str, create: bool) -> int | None:
    """Make sure a database file is at ``path`` before SQLite opens it.

    Returns the open descriptor of the file when it was created here (the caller
    checks with :func:`same_file` that SQLite opened that file, then closes it, as
    ``backup`` does), else None. The caller has refused a link (:func:`refuse_link`).

    Raises:
        DatabaseNotFound: the folder is missing, or the file is and ``create`` is false.
        SymlinkRefused: a link was made at ``path`` since.
    """
    if create:
        try:
            return create_private(path)
        except FileExistsError:
            refuse_link(path)  # a link made since the look above
            return None
        except FileNotFoundError:
            require_folder(path)
            raise
    if not os.path.exists(path):
        require_folder(path)
        raise DatabaseNotFound(
            f"{path} does not exist, and this does not create a database "
            "(Store(create=False), or a command that only reads: check the path, "
            "--db or FLOWDROP_DB)"
        )
    return None


def opened_as_created(fd: int, path: str) -> None:
    """Raise SymlinkRefused (or FlowdropError) unless ``path`` is still the file created as ``fd``.

    SQLite opens the path again after the library created it: a link or a file
    swapped in between would be what it writes.
    """
    refuse_link(path)
    if not same_file(fd, path):
        raise FlowdropError(f"{path} was replaced while it was being created; not opening it")


def set_defensive(conn: sqlite3.Connection) -> None:
    """Turn on SQLITE_DBCONFIG_DEFENSIVE where Python exposes it (3.12+).

    It keeps SQL from corrupting the file on purpose (``writable_schema``, direct
    writes to shadow tables); the library uses none of those features.
    """
    setconfig = getattr(conn, "setconfig", None)
    if setconfig is not None:
        setconfig(getattr(sqlite3, "SQLITE_DBCONFIG_DEFENSIVE"), True)  # noqa: B009


def same_file(fd: int, path: str) -> bool:
    """Whether ``path`` itself (not a link's target) is the file open as ``fd``."""
    try:
        at_path = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (at_path.st_dev, at_path.st_ino) == (opened.st_dev, opened.st_ino)


def remove_database(path: str, fd: int | None = None) -> None:
    """Remove a database file this process created, with its sidecars; missing ones are fine.

    With ``fd`` (the file as created), nothing is removed unless ``path`` is still
    that file, so a file someone put in its place (and its sidecars) is left alone.
    """
    if fd is not None and not same_file(fd, path):
        return
    for name in (path, *(path + suffix for suffix in SIDECARS)):
        _unlink(name)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
