"""What the viewer tests share: a database of conversations and a real ``serve`` process."""

from __future__ import annotations

import base64
import http.client
import http.server
import os
import select
import struct
import subprocess
import sys
import threading
import urllib.parse
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flowdrop_local import Store


def _png(width: int, height: int) -> str:
    """A small sky-to-sea gradient as a ``data:`` PNG (made here: no file, no network)."""
    rows = b"".join(
        b"\x00" + bytes(v for x in range(width) for v in (40 + y * 3, 120 + y * 2, 220 - x))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
    return "data:image/png;base64," + base64.b64encode(png + chunk(b"IEND", b"")).decode()


PIXEL_SIZE = (96, 48)
PIXEL = _png(*PIXEL_SIZE)
SCRIPT = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">"
AGENT = ("demo", "local", "weather-agent")
XSS = ("demo", "local", "hostile")
PAGED = ("demo", "local", "paged")
LONG = ("bench", "long", "history")
WIDEN = ("demo", "local", "parallel-calls")
PAGED_SIZE = 250
LONG_SIZE = 100_000


class CountingServer(http.server.ThreadingHTTPServer):
    """A stand-in for a remote image host, or another local server: what it is sent."""

    hits: list[str]
    cookies: list[str]


class _Count(http.server.BaseHTTPRequestHandler):
    server: CountingServer

    def do_GET(self) -> None:
        self.server.hits.append(self.path)
        self.server.cookies.append(self.headers.get("Cookie") or "")
        body = b"" if self.path.endswith(".png") else b"another local server"
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def counting_server() -> Iterator[CountingServer]:
    server = CountingServer(("127.0.0.1", 0), _Count)
    server.hits = []
    server.cookies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def remote_image_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/pixel.png"


def build(path: Path, remote_port: int, *, long_size: int = LONG_SIZE) -> None:
    """The conversations the viewer tests open (the 100,000-message one through import)."""
    with Store(path) as store:
        agent = store.buffer(*AGENT)
        agent.append(
            [
                {"role": "system", "content": "You are a helpful assistant with a weather tool."},
                {"role": "user", "content": "Will I need an umbrella in Lisbon tomorrow?"},
                {
                    "role": "assistant",
                    "content": "Let me check the forecast.",
                    "tool_calls": [
                        {
                            "id": "call_weather_1",
                            "type": "function",
                            "function": {
                                "name": "get_forecast",
                                "arguments": '{"city": "Lisbon", "day": "tomorrow"}',
                            },
                        }
                    ],
                },
            ]
        )
        # The tool never answers before the user writes again: healed (MEM-3) ...
        agent.append({"role": "user", "content": "Hello? Are you still there?"})
        # ... and its late result replaces the placeholder in place (MEM-10).
        agent.append(
            {"role": "tool", "tool_call_id": "call_weather_1", "content": "Rain, 14 C, 80%"}
        )
        agent.append(
            {
                "role": "assistant",
                "content": "Yes: rain is expected. Checking the radar too.",
                "tool_calls": [{"id": "call_radar_2", "name": "radar", "arguments": {"km": 50}}],
            }
        )
        # This call stays unanswered: its placeholder is what the buffer keeps.
        agent.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Here is the sky and a photo link:"},
                    {"type": "image_url", "image_url": {"url": PIXEL}},
                    {"type": "image_url", "image_url": {"url": remote_image_url(remote_port)}},
                ],
            }
        )
        agent.append({"role": "assistant", "content": "Take an umbrella."})

        store.buffer(*XSS).append(
            [
                {"role": "user", "content": SCRIPT},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "<b>id</b>", "name": "<i>tool</i>", "arguments": SCRIPT}
                    ],
                },
                {"role": "tool", "tool_call_id": "<b>id</b>", "content": SCRIPT},
            ]
        )
        store.buffer(*WIDEN).append(
            [
                {"role": "user", "content": "compare three cities"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": f"p{i}", "name": "forecast"} for i in range(3)],
                },
                *({"role": "tool", "tool_call_id": f"p{i}", "content": f"r{i}"} for i in range(3)),
                {"role": "assistant", "content": "all done"},
            ]
        )
        store.buffer(*PAGED).append(
            [
                {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}
                for i in range(PAGED_SIZE)
            ]
        )
        store.import_records(
            {
                "scope": LONG[0],
                "scope_id": LONG[1],
                "key": LONG[2],
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"long message {i}",
            }
            for i in range(long_size)
        )
        # The agent conversation is the most recent one.
        agent.append({"role": "user", "content": "Thanks!"})


@contextmanager
def serving(
    db: Path | str, *args: str, browser: bool = False, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``flowdrop-local serve --no-browser --db DB`` as a real process; yields its first line.

    ``browser``: without ``--no-browser`` (``$BROWSER`` in ``env`` says which one).
    """
    command = [sys.executable, "-m", "flowdrop_local.cli", "serve"]
    if not browser:
        command.append("--no-browser")
    process = subprocess.Popen(
        [*command, "--db", str(db), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "serve printed nothing in 60 s"
        line = process.stdout.readline().rstrip("\n")
        assert line, process.stderr.read() if process.stderr else ""
        yield line, process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def connect(url: str, timeout: float = 30) -> http.client.HTTPConnection:
    """A connection to the server of ``url``.

    A name under ``.localhost`` is the loopback address, as browsers resolve it
    (RFC 6761); this machine's resolver need not know it.
    """
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    name = "127.0.0.1" if parts.hostname.endswith(".localhost") else parts.hostname
    return http.client.HTTPConnection(name, parts.port, timeout=timeout)


def get(
    url: str,
    *,
    host: str | None = None,
    cookie: str | None = None,
    method: str = "GET",
    headers: dict[str, str] | None = None,
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request for ``url``'s path and query, with its Host (or ``host``); no redirect."""
    parts = urllib.parse.urlsplit(url)
    conn = connect(url)
    try:
        conn.putrequest(method, parts.path + ("?" + parts.query if parts.query else ""),
                        skip_host=True, skip_accept_encoding=True)  # fmt: skip
        if host != "":
            conn.putheader("Host", host or parts.netloc)
        if cookie is not None:
            conn.putheader("Cookie", cookie)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", "0")
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


_SESSIONS: dict[str, str] = {}


def session_cookie(url: str) -> str:
    """The cookie (``name=value``) a browser holds once it opened the printed ``url``.

    The printed link works once: it is opened here once per URL and the cookie kept.
    """
    if url not in _SESSIONS:
        status, headers, body = get(url)
        cookie = headers["Set-Cookie"]
        assert cookie, (status, body)
        _SESSIONS[url] = cookie.split(";")[0]
    return _SESSIONS[url]


def origin(url: str) -> str:
    """``scheme://host:port`` of ``url``."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def replay(url: str, cookie: str | None = None) -> int:
    """What a client holding only ``url`` (and ``cookie``) gets from the conversations API.

    It opens ``url`` as a browser would, keeps any cookie it is given, then asks
    for the conversations: 200 means ``url`` (or ``cookie``) was a way in.
    """
    status, headers, _ = get(url, cookie=cookie)
    given = headers["Set-Cookie"]
    if given:
        cookie = given.split(";")[0]
    status, _, _ = get(origin(url) + "/api/conversations", cookie=cookie)
    return status


def request(
    url: str,
    path: str,
    *,
    session: bool = True,
    host: str | None = None,
    cookie: str | None = None,
    method: str = "GET",
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One HTTP request to the viewer at ``url`` (the printed line), Host and cookie as given.

    ``session``: with the cookie the printed link gave (unless ``cookie`` is given).
    """
    if session and cookie is None:
        cookie = session_cookie(url)
    return get(origin(url) + path, host=host, cookie=cookie, method=method)


def address_query(address: tuple[str, str, str], **extra: str | int) -> str:
    scope, scope_id, key = address
    return urllib.parse.urlencode({"scope": scope, "scope_id": scope_id, "key": key, **extra})


def artifacts() -> Path:
    """Where a test run keeps its screenshots: $FLOWDROP_ARTIFACTS, else tests/artifacts/."""
    folder = Path(os.environ.get("FLOWDROP_ARTIFACTS") or Path(__file__).parent / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
