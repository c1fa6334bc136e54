"""``flowdrop-local serve``: a local, read-only web page over a store.

Standard library only (:class:`http.server.ThreadingHTTPServer`), and a page of
plain HTML, CSS and JavaScript shipped in the package (``static/``). Safe by
default, each point tested in ``tests/test_viewer_server.py``:

* it binds to 127.0.0.1 and an ephemeral port unless told otherwise;
* every request carries a random token: the ``token`` query parameter of the
  printed URL (as Jupyter does), then a cookie the first visit sets; anything
  else gets 403;
* the ``Host`` header must name the bound host, ``localhost`` or a loopback
  address with the bound port, else 403, so a DNS-rebinding page cannot reach it;
* it never writes: a SQLite file is opened read-only (``mode=ro``); a PostgreSQL
  database through connections whose transactions are all read-only
  (``default_transaction_read_only``);
* every response carries a Content-Security-Policy that loads nothing from
  anywhere but the viewer itself (images also from ``data:``), and the page sets
  stored text with ``textContent`` only; JSON escapes ``<``, ``>`` and ``&`` too.
"""

from __future__ import annotations

import hmac
import http.cookies
import json
import logging
import secrets
import socket
import sys
import threading
import urllib.parse
import webbrowser
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Final

from ..backends import is_postgresql_target
from ..buffer import check_limit
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
_LOOPBACK: Final = frozenset({"localhost", "127.0.0.1", "[::1]"})
_MAX_PAGE: Final = 1_000


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

    from ..backends.postgresql import redact

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
        with Store(pool, create=False) as store:
            yield store


class ViewerServer(ThreadingHTTPServer):
    """The viewer's HTTP server: one catalog, one token, one bound address."""

    daemon_threads = True

    def __init__(self, catalog: Catalog, host: str = "127.0.0.1", port: int = 0) -> None:
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
        try:
            super().__init__((host.strip("[]"), port), _Handler)
        except (OSError, UnicodeError) as error:  # taken, not ours, or no such name
            reason = getattr(error, "strerror", None) or str(error)
            raise InvalidArgument(f"cannot listen on {host}:{port}: {reason}") from None
        self.catalog = catalog
        self.token = secrets.token_urlsafe(32)
        self.port: int = self.server_address[1]
        bound = host.strip("[]").lower()
        self.shown_host = (
            "127.0.0.1"
            if bound in ("", "0.0.0.0")
            else "[::1]"
            if bound == "::"
            else f"[{bound}]"
            if ":" in bound
            else bound
        )
        self.allowed_hosts = _LOOPBACK | {self.shown_host}
        self.cookie = f"flowdrop_token_{self.port}"

    @property
    def url(self) -> str:
        """The page's address, token included."""
        return f"http://{self.shown_host}:{self.port}/?token={self.token}"

    def host_allowed(self, header: str | None) -> bool:
        """``Host`` names this server (a DNS-rebinding page sends its own name)."""
        if not header:
            return False
        value = header.strip().lower()
        if value.startswith("["):  # an IPv6 literal: [::1]:8000
            name, _, rest = value.partition("]")
            name += "]"
            port = rest.removeprefix(":") if rest.startswith(":") or not rest else "-"
        else:
            name, _, port = value.partition(":")
        if port and port != str(self.port):
            return False
        if not port and self.port != 80:
            return False
        return name in self.allowed_hosts


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer
    protocol_version = "HTTP/1.1"

    def version_string(self) -> str:
        return "flowdrop-local"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

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

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    # ----------------------------------------------------------------- access

    def _token_ok(self, query: dict[str, list[str]]) -> tuple[bool, dict[str, str]]:
        """Whether the request carries the token; the cookie to set on a first visit."""
        expected = self.server.token.encode()
        given = query.get("token", [""])[-1]
        if given and hmac.compare_digest(given.encode(), expected):
            cookie = f"{self.server.cookie}={self.server.token}; Path=/; HttpOnly; SameSite=Strict"
            return True, {"Set-Cookie": cookie}
        jar = http.cookies.SimpleCookie()
        try:
            jar.load(self.headers.get("Cookie", ""))
        except http.cookies.CookieError:
            return False, {}
        morsel = jar.get(self.server.cookie)
        if morsel is not None and hmac.compare_digest(morsel.value.encode(), expected):
            return True, {}
        return False, {}

    def do_GET(self) -> None:
        if not self.server.host_allowed(self.headers.get("Host")):
            self._error(HTTPStatus.FORBIDDEN, "this server answers to localhost only")
            return
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        allowed, cookie = self._token_ok(query)
        if not allowed:
            self._error(HTTPStatus.FORBIDDEN, "open the URL flowdrop-local serve printed")
            return
        if url.path in _STATIC:
            name, content_type = _STATIC[url.path]
            body = (resources.files(__package__) / "static" / name).read_bytes()
            self._send(HTTPStatus.OK, body, content_type, cookie)
            return
        if url.path == "/favicon.ico":  # browsers ask for it; there is none
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon", cookie)
            return
        route = _ROUTES.get(url.path)
        if route is None:
            self._error(HTTPStatus.NOT_FOUND, f"no page {url.path}")
            return
        try:
            self._json(HTTPStatus.OK, route(self.server.catalog, query), cookie)
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
    return min(check_limit(int(text)), _MAX_PAGE)


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
    standard output and flushes) before the browser is opened.
    """
    with open_read_only(target) as store:
        server = ViewerServer(Catalog(store), host, port)
        try:
            with suppress(KeyboardInterrupt):
                (announce or _print)(server.url)
                if open_browser:
                    browser = threading.Thread(
                        target=webbrowser.open, args=(server.url,), daemon=True
                    )
                    browser.start()
                server.serve_forever()
        finally:
            server.server_close()


def _print(url: str) -> None:
    print("Serving the read-only viewer; press Ctrl-C to stop.", file=sys.stderr, flush=True)
    print(url, flush=True)
