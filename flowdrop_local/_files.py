"""Creating and removing the files a store writes: private, exclusive, never through a link.

A database holds every conversation, so the library creates each file it writes
(the database itself, a backup) with mode 0600 before SQLite opens it; SQLite
gives the ``-wal``, ``-shm`` and ``-journal`` files the mode of their database.
Creation is exclusive and does not follow a symbolic link, so a file or a
dangling link planted at the path is never written through or overwritten.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3

from .errors import DatabaseNotFound, InvalidArgument

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
    """``path`` as a str, or InvalidArgument naming ``what`` (a number, bytes, a NUL)."""
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgument(
            f"{what} must be a path (str or os.PathLike), not {type(path).__name__}"
        )
    text = os.fspath(path)
    if not isinstance(text, str):
        raise InvalidArgument(f"{what} must be a text path, not {type(text).__name__}")
    if not text or "\x00" in text:
        raise InvalidArgument(f"{what} must be a non-empty path without NUL characters: {text!r}")
    return text


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


def open_or_create(path: str, create: bool) -> bool:
    """Make sure a database file is at ``path`` before SQLite opens it; True if created here.

    One system call when the file exists (the common case: every open).

    Raises:
        DatabaseNotFound: the folder is missing, or the file is and ``create`` is false.
    """
    if create:
        try:
            os.close(create_private(path))
        except FileExistsError:
            return False
        except FileNotFoundError:
            require_folder(path)
            raise
        return True
    if not os.path.exists(path):
        require_folder(path)
        raise DatabaseNotFound(
            f"{path} does not exist, and this does not create a database "
            "(Store(create=False), or a command that only reads: check the path, "
            "--db or FLOWDROP_DB)"
        )
    return False


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
