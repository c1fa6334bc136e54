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
folder on the way may be a link (``/tmp`` on macOS is one). Anything else at the
path that is not a regular file (a FIFO, a socket, a device, a folder) is refused
too, :class:`~flowdrop_local.errors.NotADatabase`, before SQLite opens it: a FIFO
would block a read-only open for ever.

A file is trusted for writing only if another user cannot have planted it
(:func:`refuse_untrusted`, :class:`~flowdrop_local.errors.UnsafeFile`): an existing
empty file gets the schema written into it only when it is ours, mode-private (no
group or other bits) and has one link; an existing database (or its -wal, -shm or
-journal) that another user owns and group or others may write is refused. The
-wal and -shm SQLite creates take the database file's mode, so it stays 0600.

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
    NotADatabase,
    SymlinkRefused,
    UnsafeFile,
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


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def refuse_link(path: str) -> None:
    """Raise SymlinkRefused when ``path``, or its -wal, -shm or -journal, is a symbolic link,
    and NotADatabase when ``path`` is anything else but a regular file (every open mode).

    SQLite refuses a linked sidecar itself, but with a message that reads as a
    corrupt file; a link at the database path it follows. A FIFO at the path
    blocks a read-only open until a writer comes, that is for ever.
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
        if name == path and not stat.S_ISREG(mode):
            kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
            raise NotADatabase(
                f"{path} is {kind}, not a regular file; a database is a file: "
                "check the path, --db or FLOWDROP_DB"
            )


def refuse_untrusted(path: str, *, initialise: bool = True) -> None:
    """Raise UnsafeFile when a file at ``path`` (or its -wal, -shm or -journal) may
    have been planted by another user, before the library opens it for writing.

    * An existing empty file gets the schema written into it only when it belongs
      to the current user, has no group or other permission bits and one link:
      another user's file (or a hard link to one) would hold every message.
    * An existing database, or sidecar, that another user owns and that group or
      others may write is refused: its owner (or anyone) reads and changes it.
      A database shared on purpose is owned by one user and opened read-only by
      the others, or kept group-readable only.

    ``initialise=False`` (an open that does not create the schema): the second rule only.
    """
    me = getattr(os, "geteuid", lambda: None)()
    if me is None:  # no POSIX ownership (Windows)
        return
    for name in (path, *(path + suffix for suffix in SIDECARS)):
        try:
            info = os.lstat(name)
        except OSError:
            continue
        mode = stat.S_IMODE(info.st_mode)
        owner = "you" if info.st_uid == me else f"uid {info.st_uid}"
        if initialise and name == path and info.st_size == 0 and stat.S_ISREG(info.st_mode):
            if info.st_uid != me or mode & 0o077 or info.st_nlink != 1:
                raise UnsafeFile(
                    f"{path} exists, empty, owned by {owner}, mode {mode:04o}, "
                    f"{info.st_nlink} link(s): flowdrop_local writes a new database only "
                    "into a file of yours, mode 0600, with one link (another user may have "
                    "put it there to read what you store); remove it, or give another path"
                )
        elif info.st_uid != me and mode & 0o022:
            raise UnsafeFile(
                f"{name} is owned by {owner} and writable by group or others (mode "
                f"{mode:04o}): not writing a database that another user can read and "
                "change; open it read-only, or have its owner make it private (chmod 600)"
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
        UnsafeFile: the file there may be another user's (:func:`refuse_untrusted`).
    """
    if create:
        try:
            return create_private(path)
        except FileExistsError:
            refuse_link(path)  # a link made since the look above
            refuse_untrusted(path)
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
    refuse_untrusted(path, initialise=False)  # an empty file gets no schema (prepare says so)
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
