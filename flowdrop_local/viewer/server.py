"""``flowdrop-local serve``: a local, read-only web page over a store.

Standard library only (:class:`http.server.ThreadingHTTPServer`), and a page of
plain HTML, CSS and JavaScript shipped in the package (``static/``). Safe by
default, each point tested in ``tests/test_viewer_server.py`` and
``tests/test_viewer_browser.py``. Against another local user, or a page that
another local process serves on any port:

* it binds to 127.0.0.1 and an ephemeral port unless told otherwise, and answers
  only to a per-launch name, ``<32 random hex>.localhost`` (browsers resolve any
  name under ``localhost`` to the loopback address, RFC 6761): the ``Host`` header
  must be that name with the port, else 403. Cookies ignore ports but not names,
  so the viewer's cookie is never sent to another local server; a DNS-rebinding
  page sends its own name and is refused too;
* the printed URL carries a one-time code: the first visit trades it for a
  session cookie (``HttpOnly; SameSite=Strict``) and is redirected to the bare
  ``/``, so no reusable secret stays in the address bar or the history. The
  browser ``serve`` opens is given a ``file:`` page (0600, in a 0700 folder) that
  holds a second code (two minutes): its command line, which any local user can
  read in ``/proc``, holds no secret; the page is deleted once used;
* the data (``/api/``) needs the session cookie, and a browser request from
  another site (``Sec-Fetch-Site``, ``Origin``) is refused; the page itself
  (``/``, ``/static/``) is the package's files, served to anyone who names the
  host;
* one client holds little: a request's head must arrive within 10 s (else 408),
  and past 32 open connections a new one is answered 503 at once;
* it never writes: a SQLite file is opened read-only (``mode=ro``); a PostgreSQL
  database through connections whose transactions are all read-only
  (``default_transaction_read_only``);
* every response carries a Content-Security-Policy that loads nothing from
  anywhere but the viewer itself (images also from ``data:``), and the page sets
  stored text with ``textContent`` only; JSON escapes ``<``, ``>`` and ``&`` too.
"""

from __future__ import annotations

import hmac
import html
import http.cookies
import io
import ipaddress
import json
import logging
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
import webbrowser
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any, Final

from ..backends import is_postgresql_target
from ..buffer import valid_limit
from ..errors import FlowdropError, InvalidArgument, MessageNotFound, NotADatabase, shown
from ..store import Store
from .catalog import Catalog

__all__ = ["CSP", "ViewerServer", "open_read_only", "serve"]

log = logging.getLogger(__name__)

CSP: Final = (
    "default-src 'self'; img-src 'self' data:; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}
_STATIC: Final = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}
_MAX_PAGE: Final = 1_000
HEAD_TIMEOUT: Final = 10.0
"""Seconds a request's line and headers may take to arrive, in all (else 408)."""
MAX_CONNECTIONS: Final = 32
"""Connections open at once; the next is answered 503 and closed."""
BROWSER_CODE_LIFETIME: Final = 120.0
"""Seconds the code given to the launched browser stays usable."""


@contextmanager
def open_read_only(target: str) -> Iterator[Store]:
    """The store at ``target`` for reading only, closed on exit; nothing is created.

    SQLite: the file opened ``mode=ro``. PostgreSQL: a pool whose connections set
    ``default_transaction_read_only``, so even a bug here could not write.

    Raises:
        ReadOnlyStore: the SQLite file does not exist (or needs a schema upgrade).
        NotADatabase, NotAFlowdropDatabase: the target cannot be read as a store.
    """
    if not is_postgresql_target(target):
        with Store(target, read_only=True, create=False) as store:
            yield store
        return
    import psycopg
    import psycopg_pool
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from ..backends.postgresql_dialect import redact

    params = conninfo_to_dict(target)
    options = str(params.get("options") or "")
    params["options"] = f"{options} -c default_transaction_read_only=on".strip()
    conninfo = make_conninfo("", **params)
    try:
        psycopg.connect(conninfo, connect_timeout=10).close()
    except psycopg.Error as error:
        raise NotADatabase(f"cannot connect to {redact(target)}: {type(error).__name__}") from None
    with psycopg_pool.ConnectionPool(
        conninfo, min_size=1, max_size=4, open=False, kwargs={"autocommit": True}
    ) as pool:
        pool.open(wait=True, timeout=30)
        from .._cli_common import shared_schema

        with Store(pool, create=False, shared_schema=shared_schema()) as store:
            yield store


def _is_local(bound: str) -> bool:
    """Whether browsers on this machine reach ``bound`` through the loopback address."""
    if bound == "localhost":
        return True
    try:
        address = ipaddress.ip_address(bound)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _busy_reply() -> bytes:
    body = b'{"error": "too many open connections; try again"}'
    head = "".join(f"{name}: {value}\r\n" for name, value in _HEADERS.items())
    return (
        b"HTTP/1.1 503 Service Unavailable\r\n"
        + head.encode()
        + b"Content-Type: application/json; charset=utf-8\r\n"
        + b"Content-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n\r\n" % len(body)
        + body
    )


class ViewerServer(ThreadingHTTPServer):
    """The viewer's HTTP server: one catalog, one bound address, its codes and sessions."""

    daemon_threads = True
    request_queue_size = 64  # the listen backlog: 5 drops a burst of connections for 1 s

    def __init__(
        self,
        catalog: Catalog,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        head_timeout: float = HEAD_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        """Bind ``host``:``port`` (0: any free port) at once.

        Raises:
            InvalidArgument: an empty host (that would be every interface), or one
                this machine cannot listen on, or a port in use.
        """
        if not host.strip("[] "):
            raise InvalidArgument("--host must name an address, such as 127.0.0.1")
        if not (host.isascii() and host.isprintable()) or " " in host:
            raise InvalidArgument(f"--host {shown(host)} is not an address or a host name")
        if ":" in host.strip("[]"):
            self.address_family = socket.AF_INET6
        self._lock = threading.Lock()
        self.launch_page: Path | None = None  # before binding: a failed bind closes
        try:
            super().__init__((host.strip("[]"), port), _Handler)
        except (OSError, UnicodeError) as error:  # taken, not ours, or no such name
            reason = getattr(error, "strerror", None) or str(error)
            raise InvalidArgument(f"cannot listen on {host}:{port}: {reason}") from None
        self.catalog = catalog
        self.port: int = self.server_address[1]
        self.head_timeout = head_timeout
        self.max_connections = max_connections
        self.launch_code_lifetime = BROWSER_CODE_LIFETIME
        bound = host.strip("[]").lower()
        if _is_local(bound):
            # A name of its own: cookies are scoped to names, not ports, so the
            # cookie of <label>.localhost never goes to a server on 127.0.0.1.
            self.hostname = f"{secrets.token_hex(16)}.localhost"
        else:
            self.hostname = f"[{bound}]" if ":" in bound else bound
        self.origin = f"http://{self.hostname}:{self.port}"
        self.cookie = f"flowdrop_session_{self.port}"
        self._codes: dict[str, float] = {}  # one-time code -> when it expires
        self._sessions: list[str] = []
        self._open = 0
        self._launch_code = ""
        self._printed = self._new_code(float("inf"))

    @property
    def url(self) -> str:
        """The page's address with its one-time code: the link ``serve`` prints."""
        return f"{self.origin}/?code={self._printed}"

    def _new_code(self, lifetime: float) -> str:
        code = secrets.token_urlsafe(32)
        with self._lock:
            self._codes[code] = time.monotonic() + lifetime
        return code

    def host_allowed(self, header: str | None) -> bool:
        """``Host`` is this launch's name and port (a DNS-rebinding page sends its own)."""
        if not header:
            return False
        value = header.strip().lower()
        return value == f"{self.hostname}:{self.port}" or (
            self.port == 80 and value == self.hostname
        )

    def redeem(self, code: str) -> str | None:
        """A new session for a code not used before and not expired; the code is spent."""
        with self._lock:
            expires = self._codes.pop(code, None) if code else None
            if expires is None or expires < time.monotonic():
                return None
            session = secrets.token_urlsafe(32)
            self._sessions.append(session)
        if code == self._launch_code:
            self._remove_launch_page()
        return session

    def session_ok(self, value: str) -> bool:
        """``value`` is a session a code was traded for."""
        given = value.encode()
        with self._lock:
            sessions = list(self._sessions)
        return any(hmac.compare_digest(given, s.encode()) for s in sessions)

    # ------------------------------------------------------------ the browser

    def write_launch_page(self) -> Path:
        """A ``file:`` page, readable by its owner only, that sends a browser to the viewer.

        It holds a code of its own (``launch_code_lifetime``, two minutes), so
        that the browser's command line (``/proc/<pid>/cmdline``, readable by every
        local user) names only this file; the page is deleted once its code is
        used, or when the server closes.
        """
        self._remove_launch_page()
        folder = Path(tempfile.mkdtemp(prefix="flowdrop-viewer-"))  # 0700
        code = self._new_code(self.launch_code_lifetime)
        target = html.escape(f"{self.origin}/?code={code}")
        page = folder / "open.html"
        descriptor = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(
                '<!doctype html><meta charset="utf-8"><meta name="referrer" content="no-referrer">'
                f'<meta http-equiv="refresh" content="0;url={target}">'
                f'<title>flowdrop-local viewer</title><a href="{target}">Open the viewer</a>\n'
            )
        with self._lock:
            self.launch_page, self._launch_code = page, code
        return page

    def open_browser(self) -> None:
        """Open the system's browser on :meth:`write_launch_page` (``webbrowser``)."""
        webbrowser.open(self.write_launch_page().as_uri())

    def _remove_launch_page(self) -> None:
        with self._lock:
            page, self.launch_page = self.launch_page, None
        if page is not None:
            shutil.rmtree(page.parent, ignore_errors=True)

    def server_close(self) -> None:
        super().server_close()
        self._remove_launch_page()

    # ------------------------------------------------------------ connections

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, up to ``max_connections``; past that 503 at once."""
        with self._lock:
            busy = self._open >= self.max_connections
            if not busy:
                self._open += 1
        if busy:
            self._turn_away(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self._lock:
                self._open -= 1
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._open -= 1

    def _turn_away(self, request: socket.socket) -> None:
        """Answer 503 without a thread and without waiting for the client."""
        with suppress(OSError):
            request.setblocking(False)
            request.send(_busy_reply())
            request.shutdown(socket.SHUT_WR)
            # What the client already sent is read, so that closing sends FIN, not
            # a reset that could discard the answer before the client reads it.
            for _ in range(16):  # bounded: a client that keeps sending is not waited for
                if not request.recv(65536):
                    break
        request.close()


class _HeadReader(io.RawIOBase):
    """The connection's socket read against a deadline for a request's whole head.

    A timeout per ``recv`` alone lets a client that sends a byte every few seconds
    hold its thread for ever; each read here waits only for what is left.
    """

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.deadline: float | None = None
        self.received = 0
        self.timed_out = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                raise TimeoutError("the request's head took too long")
            self.connection.settimeout(left)
        try:
            count = self.connection.recv_into(buffer)
        except TimeoutError:
            self.timed_out = self.deadline is not None
            raise
        self.received += count
        return count


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        return "flowdrop-local"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # ------------------------------------------------------------- the socket

    def setup(self) -> None:
        super().setup()
        self._reader = _HeadReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        """One request whose head must arrive within ``head_timeout``, else 408."""
        reader = self._reader
        reader.deadline = time.monotonic() + self.server.head_timeout
        reader.received = 0
        reader.timed_out = False
        self.requestline, self.command, self.request_version = "", "", "HTTP/1.1"
        super().handle_one_request()  # a timeout ends it, with close_connection set
        if reader.timed_out and reader.received:  # not an idle keep-alive connection
            self.close_connection = True
            self.connection.settimeout(1)
            self.request_version = "HTTP/1.1"
            with suppress(OSError):
                self._error(
                    HTTPStatus.REQUEST_TIMEOUT, "the request took too long", {"Connection": "close"}
                )

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        # The head is in: writing the answer may block for a whole timeout per send.
        self._reader.deadline = None
        self.connection.settimeout(self.server.head_timeout)
        return parsed

    # ---------------------------------------------------------------- replies

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        for name, value in {**_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value: Any, extra: dict[str, str] | None = None) -> None:
        text = json.dumps(value, ensure_ascii=False)
        # Markup characters only occur inside JSON strings: escaped, the body is
        # inert even if something rendered it as HTML.
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        self._send(status, text.encode(), "application/json; charset=utf-8", extra)

    def _error(self, status: int, message: str, extra: dict[str, str] | None = None) -> None:
        # A refused request ends its connection: a client (another local user, say)
        # that sends only requests refused could otherwise hold every one of the
        # max_connections slots open with keep-alive, and the owner would get 503s.
        self.close_connection = True
        self._json(status, {"error": message}, {**(extra or {}), "Connection": "close"})

    # ----------------------------------------------------------------- access

    def _session(self) -> bool:
        """The request carries a session cookie this server gave."""
        jar = http.cookies.SimpleCookie()
        try:
            jar.load(self.headers.get("Cookie", ""))
        except http.cookies.CookieError:
            return False
        morsel = jar.get(self.server.cookie)
        return morsel is not None and self.server.session_ok(morsel.value)

    def _cross_site(self) -> bool:
        """A browser says another site (another port counts) made this request."""
        fetch_site = self.headers.get("Sec-Fetch-Site")
        if fetch_site is not None and fetch_site not in ("same-origin", "none"):
            return True
        origin = self.headers.get("Origin")
        return origin is not None and origin != self.server.origin

    def _redeem(self, code: str) -> None:
        """The printed link: trade its code for a cookie, then show the bare page.

        A 303 to ``/`` keeps the code out of the address bar; the history keeps
        the link, but its code is spent.
        """
        session = self.server.redeem(code)
        if session is not None:
            cookie = f"{self.server.cookie}={session}; Path=/; HttpOnly; SameSite=Strict"
            self._send(
                HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/", "Set-Cookie": cookie}
            )
        elif self._session():  # a used link opened again in the browser that used it
            self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/"})
        else:
            self._error(
                HTTPStatus.FORBIDDEN,
                "this link was used already or has expired: restart flowdrop-local serve",
            )

    def do_GET(self) -> None:
        if not self.server.host_allowed(self.headers.get("Host")):
            self._error(HTTPStatus.FORBIDDEN, "this server answers to the name it printed only")
            return
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        if url.path == "/" and "code" in query and self.command == "GET":
            self._redeem(query["code"][-1])
            return
        if url.path in _STATIC:  # the package's own files: no data in them
            name, content_type = _STATIC[url.path]
            body = (resources.files(__package__) / "static" / name).read_bytes()
            self._send(HTTPStatus.OK, body, content_type)
            return
        if url.path == "/favicon.ico":  # browsers ask for it; there is none
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            return
        if self._cross_site():
            self._error(HTTPStatus.FORBIDDEN, "a request from another site")
            return
        if not self._session():
            self._error(HTTPStatus.FORBIDDEN, "open the URL flowdrop-local serve printed")
            return
        route = _ROUTES.get(url.path)
        if route is None:
            self._error(HTTPStatus.NOT_FOUND, f"no page {url.path}")
            return
        try:
            self._json(HTTPStatus.OK, route(self.server.catalog, query))
        except MessageNotFound as error:
            self._error(HTTPStatus.NOT_FOUND, str(error))
        except FlowdropError as error:
            self._error(HTTPStatus.BAD_REQUEST, str(error))
        except Exception:
            log.exception("the viewer failed to answer %s", url.path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error (see the terminal)")

    do_HEAD = do_GET

    def _refuse(self) -> None:
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "the viewer is read-only")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse


# ------------------------------------------------------------------ routes


def _one(query: dict[str, list[str]], name: str, default: str | None = None) -> str:
    values = query.get(name)
    if not values:
        if default is None:
            raise InvalidArgument(f"missing query parameter {name!r}")
        return default
    return values[-1]


def _limit(query: dict[str, list[str]], default: int) -> int:
    text = _one(query, "limit", str(default))
    if not (text.isascii() and text.isdigit()) or len(text) > 6:
        raise InvalidArgument(f"limit must be a whole number, got {text!r}")
    return min(valid_limit(int(text)), _MAX_PAGE)


def _conversations(catalog: Catalog, query: dict[str, list[str]]) -> Any:
    return catalog.conversations(limit=_limit(query, 50), after=_one(query, "after", "") or None)


def _transcript(catalog: Catalog, query: dict[str, list[str]]) -> Any:
    address = (_one(query, "scope"), _one(query, "scope_id"), _one(query, "key"))
    before = _one(query, "before", "") or None
    return catalog.transcript(address, limit=_limit(query, 100), before=before)


def _search(catalog: Catalog, query: dict[str, list[str]]) -> Any:
    def optional(name: str) -> str | None:
        return query[name][-1] if name in query else None

    return catalog.search(
        _one(query, "q", ""),
        scope=optional("scope"),
        scope_id=optional("scope_id"),
        key=optional("key"),
        limit=_limit(query, 20),
    )


_ROUTES: Final[dict[str, Callable[[Catalog, dict[str, list[str]]], Any]]] = {
    "/api/conversations": _conversations,
    "/api/transcript": _transcript,
    "/api/search": _search,
}


# ------------------------------------------------------------------ command


def serve(
    target: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    open_browser: bool = True,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Serve the viewer over ``target`` until interrupted; announce the URL first.

    ``announce`` receives the URL (the CLI prints it as the first line of
    standard output and flushes) before the browser is opened. The browser gets
    a code of its own (:meth:`ViewerServer.open_browser`), so the printed link
    still works once.
    """
    with open_read_only(target) as store:
        server = ViewerServer(Catalog(store), host, port)
        try:
            with suppress(KeyboardInterrupt):
                (announce or _print)(server.url)
                if open_browser:
                    threading.Thread(target=server.open_browser, daemon=True).start()
                server.serve_forever()
        finally:
            server.server_close()


def _print(url: str) -> None:
    print("Serving the read-only viewer; press Ctrl-C to stop.", file=sys.stderr, flush=True)
    print(url, flush=True)
