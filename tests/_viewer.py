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
    """A stand-in for a remote image host: it counts the requests it gets."""

    hits: list[str]


class _Count(http.server.BaseHTTPRequestHandler):
    server: CountingServer

    def do_GET(self) -> None:
        self.server.hits.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def counting_server() -> Iterator[CountingServer]:
    server = CountingServer(("127.0.0.1", 0), _Count)
    server.hits = []
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
def serving(db: Path | str, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``flowdrop-local serve --no-browser --db DB`` as a real process; yields its first line."""
    command = [sys.executable, "-m", "flowdrop_local.cli", "serve", "--no-browser"]
    process = subprocess.Popen(
        [*command, "--db", str(db), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
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


def request(
    url: str,
    path: str,
    *,
    token: bool = True,
    host: str | None = None,
    cookie: str | None = None,
    method: str = "GET",
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One HTTP request to the viewer at ``url`` (the printed line), Host and cookie as given."""
    parts = urllib.parse.urlsplit(url)
    secret = urllib.parse.parse_qs(parts.query)["token"][0]
    if token:
        path += ("&" if "?" in path else "?") + "token=" + secret
    assert parts.hostname is not None and parts.port is not None
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host != "":
            conn.putheader("Host", host or parts.netloc)
        if cookie is not None:
            conn.putheader("Cookie", cookie)
        conn.putheader("Content-Length", "0")
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def address_query(address: tuple[str, str, str], **extra: str | int) -> str:
    scope, scope_id, key = address
    return urllib.parse.urlencode({"scope": scope, "scope_id": scope_id, "key": key, **extra})


def artifacts() -> Path:
    """Where a test run keeps its screenshots: $FLOWDROP_ARTIFACTS, else tests/artifacts/."""
    folder = Path(os.environ.get("FLOWDROP_ARTIFACTS") or Path(__file__).parent / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
