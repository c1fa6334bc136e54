"""``flowdrop-local serve`` without a browser: a real process, real HTTP, a real file.

Each safety promise of the viewer is tested here (the token, the Host check, the
CSP, no write, stored text as text, no remote fetch), then the transcript model
the page and ``Buffer._repr_html_`` share, paging and the search hint.
"""

from __future__ import annotations

import contextlib
import html.parser
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from flowdrop_local import Store
from flowdrop_local.cli import cli
from flowdrop_local.errors import InvalidArgument, MessageNotFound, NotADatabase, ReadOnlyStore
from flowdrop_local.transcript import transcript
from flowdrop_local.viewer.catalog import SEARCH_HINT, Catalog, snippet_segments
from flowdrop_local.viewer.server import CSP, ViewerServer, open_read_only

from ._viewer import (
    AGENT,
    LONG,
    LONG_SIZE,
    PAGED,
    PAGED_SIZE,
    PIXEL,
    SCRIPT,
    WIDEN,
    XSS,
    CountingServer,
    address_query,
    get,
    origin,
    remote_image_url,
    replay,
    request,
    serving,
    session_cookie,
)
from .conftest import snapshot

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "flowdrop_local" / "viewer" / "static"


@pytest.fixture(scope="module")
def served(viewer_db: Path) -> Iterator[str]:
    """One ``serve`` process over the shared database; its first line of output."""
    with serving(viewer_db) as (url, _):
        yield url


def api(url: str, path: str) -> Any:
    status, headers, body = request(url, path)
    assert status == 200, body
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    return json.loads(body)


# ------------------------------------------------------------------ the process


URL = r"http://([0-9a-f]{32})\.localhost:(\d+)/\?code=([A-Za-z0-9_-]{43})"


def test_first_line_is_the_url_with_a_random_name_and_code(served: str, viewer_db: Path) -> None:
    """A per-launch name under localhost, an ephemeral port, a one-time code of 43
    URL-safe characters; a second run differs in both."""
    match = re.fullmatch(URL, served)
    assert match and int(match.group(2)) > 0
    with serving(viewer_db) as (other, _):
        second = re.fullmatch(URL, other)
        assert second and second.group(1) != match.group(1) and second.group(3) != match.group(3)


def test_serve_stops_on_interrupt_and_says_where_on_stderr(viewer_db: Path) -> None:
    """Ctrl-C (SIGINT) ends it with status 0; the stderr line says how to stop it."""
    import signal

    with serving(viewer_db) as (_, process):
        process.send_signal(signal.SIGINT)
        assert process.wait(10) == 0
        assert process.stderr is not None
        assert "press Ctrl-C to stop" in process.stderr.read()


# --------------------------------------------------------------- slow clients


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


def test_slow_clients_are_answered_408_or_503_and_hold_little(viewer_db: Path) -> None:
    """40 half-sent requests, and 3 that send a byte a second and never finish: each
    is answered 408 (its head took over 10 s) or 503 (too many open connections, at
    once) and closed, well within 15 s; the server's threads stay bounded; then a
    whole request is served."""
    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc to count threads")
    with serving(viewer_db) as (url, process):
        parts = urllib.parse.urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        name = "127.0.0.1" if parts.hostname.endswith(".localhost") else parts.hostname
        head = f"GET /api/conversations HTTP/1.1\r\nHost: {parts.netloc}\r\n".encode()
        drip = b"ET / HTTP/1.1\r\nX-Slow: " + b"a" * 100  # after a first "G"
        opened: dict[socket.socket, float] = {}
        drips: list[socket.socket] = []
        for index in range(43):
            client = socket.create_connection((name, parts.port), timeout=5)
            opened[client] = time.monotonic()
            client.sendall(b"G" if index < 3 else head)
            if index < 3:
                drips.append(client)
        started = time.monotonic()
        threads = 0
        answers = {client: b"" for client in opened}
        first: dict[socket.socket, float] = {}
        open_ = set(opened)
        sent = 0
        try:
            while open_ and time.monotonic() < started + 15:
                if not threads and time.monotonic() > started + 1:
                    threads = _threads(process.pid)
                if sent < len(drip) and time.monotonic() > started + sent:
                    for client in drips:
                        if client in open_ and client not in first:
                            with contextlib.suppress(OSError):
                                client.send(drip[sent : sent + 1])
                    sent += 1
                readable, _, _ = select.select(list(open_), [], [], 0.2)
                for client in readable:
                    try:
                        data = client.recv(65536)
                    except ConnectionResetError:
                        data = b""
                    first.setdefault(client, time.monotonic())
                    answers[client] += data
                    if not data:
                        open_.discard(client)
            assert not open_, f"{len(open_)} connections still held after 15 s"
        finally:
            for client in opened:
                client.close()
        statuses = {client: answer.split(b" ", 2)[1:2] for client, answer in answers.items()}
        assert {c: s for c, s in statuses.items() if s not in ([b"408"], [b"503"])} == {}
        assert all(statuses[client] == [b"408"] for client in drips)  # a slow drip is no escape
        refused = [c for c, s in statuses.items() if s == [b"503"]]
        assert refused and all(first[c] - opened[c] < 2 for c in refused)  # at once
        assert 0 < threads < 43, threads
        assert request(url, "/api/conversations")[0] == 200


# ---------------------------------------------------------------------- token

PAGE = ["/", "/static/app.js", "/static/style.css"]
DATA = ["/api/conversations", f"/api/transcript?{address_query(AGENT)}", "/api/search?q=rain"]
PATHS = PAGE + DATA


@pytest.mark.parametrize("path", DATA)
@pytest.mark.parametrize(
    ("cookie", "status"),
    [
        (None, 403),  # no cookie at all
        ("flowdrop_session_{port}=wrong", 403),  # a wrong cookie
        ("flowdrop_session_1={session}", 403),  # the session under another viewer's name
        ("flowdrop_session_{port}={code}", 403),  # the printed code is not a session
        ("flowdrop_session_{port}={session}", 200),  # the cookie the printed link set
    ],
    ids=["none", "wrong-cookie", "other-port-cookie", "code-as-cookie", "cookie"],
)
def test_the_data_needs_the_session_cookie(
    served: str, path: str, cookie: str | None, status: int
) -> None:
    """Without the cookie the printed link gave, every data endpoint is 403 and shows no data."""
    parts = urllib.parse.urlsplit(served)
    code = urllib.parse.parse_qs(parts.query)["code"][0]
    session = session_cookie(served).partition("=")[2]
    if cookie is not None:
        cookie = cookie.format(port=parts.port, code=code, session=session)
    got, headers, body = request(served, path, session=False, cookie=cookie)
    assert got == status, body
    if status == 403:
        assert b"weather" not in body and b"Lisbon" not in body
        assert headers["Content-Security-Policy"] == CSP
    got, _, body = request(served, f"{path}{'&' if '?' in path else '?'}code={code}", session=False)
    assert got == 403 and b"weather" not in body  # a code is traded at / only


@pytest.mark.parametrize("path", PAGE)
def test_the_page_itself_is_the_packages_files(served: str, path: str) -> None:
    """The page, script and style hold no data: served to anyone who names the host."""
    got, _, body = request(served, path, session=False)
    name = path.rpartition("/")[2] or "index.html"
    assert got == 200 and body == (STATIC / name).read_bytes()


def test_the_printed_code_works_once(viewer_db: Path) -> None:
    """Its first use sets an HttpOnly, SameSite=Strict cookie named by port and sends the
    browser to the bare page; used again (or guessed), it gives nothing, except a
    redirect to a browser that holds the cookie already."""
    with serving(viewer_db) as (url, _):
        port = urllib.parse.urlsplit(url).port
        status, headers, _ = get(url)
        assert status == 303 and headers["Location"] == "/"
        cookie = headers["Set-Cookie"]
        assert cookie.startswith(f"flowdrop_session_{port}=")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        session = cookie.split(";")[0]
        for again in (url, origin(url) + "/?code=guess", origin(url) + "/?code="):
            status, headers, body = get(again)
            assert status == 403 and headers["Set-Cookie"] is None, again
            assert b"used already" in body
        status, headers, _ = get(url, cookie=session)
        assert status == 303 and headers["Location"] == "/" and headers["Set-Cookie"] is None
        assert replay(url) == 403 and replay(origin(url) + "/", session) == 200


def test_the_browser_page_is_private_expires_and_goes_once_used(tmp_path: Path) -> None:
    """The page ``serve`` opens the browser on: 0600 in a 0700 folder of this user; its
    code is a second one-time code (the printed one still works); the page is gone
    once used, and a code past its lifetime opens nothing."""
    with Store(tmp_path / "c.db") as store:
        server = ViewerServer(Catalog(store))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            page = server.write_launch_page()
            assert page.stat().st_mode & 0o777 == 0o600
            assert page.parent.stat().st_mode & 0o777 == 0o700
            assert page.stat().st_uid == os.getuid()
            (target,) = re.findall(r'url=([^"]+)"', page.read_text())
            assert target.startswith(server.origin + "/?code=") and target != server.url
            assert replay(target) == 200
            assert not page.exists() and not page.parent.exists()
            assert replay(target) == 403 and replay(server.url) == 200
            server.launch_code_lifetime = 0.2
            late = server.write_launch_page()
            (target,) = re.findall(r'url=([^"]+)"', late.read_text())
            time.sleep(0.3)
            assert replay(target) == 403
        finally:
            server.shutdown()
            server.server_close()
    assert not late.exists() and not late.parent.exists()  # closing the server removes it


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another port of the same host
        {"Origin": "http://127.0.0.1:8888"},
        {"Origin": "null"},
    ],
)
def test_a_browser_request_from_another_site_gets_no_data(
    served: str, headers: dict[str, str]
) -> None:
    """Even with the cookie: a page elsewhere cannot have the browser fetch the data."""
    status, _, body = get(origin(served) + "/api/conversations",
                          cookie=session_cookie(served), headers=headers)  # fmt: skip
    assert status == 403 and b"weather" not in body
    same = {"Sec-Fetch-Site": "same-origin", "Origin": origin(served)}
    assert get(origin(served) + "/api/conversations",
               cookie=session_cookie(served), headers=same)[0] == 200  # fmt: skip


# ----------------------------------------------------------------------- Host


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("evil.example:{port}", 403),  # a DNS-rebinding page sends its own name
        ("evil.example", 403),
        ("{name}.evil.example:{port}", 403),
        ("{name}:1{port}", 403),  # another port
        ("{name}", 403),  # no port: port 80 is not ours
        ("", 403),  # no Host header at all
        ("127.0.0.1:{port}", 403),  # the address: its cookies would go to every port
        ("localhost:{port}", 403),
        ("[::1]:{port}", 403),
        ("other.localhost:{port}", 403),
        ("{name}:{port}", 200),
        ("{upper}:{port}", 200),
    ],
)
def test_host_header_must_name_this_server(served: str, host: str, status: int) -> None:
    """Even with the cookie, a Host other than the printed name gets 403."""
    parts = urllib.parse.urlsplit(served)
    assert parts.hostname is not None
    host = host.format(port=parts.port, name=parts.hostname, upper=parts.hostname.upper())
    got, _, body = request(served, "/api/conversations", host=host)
    assert got == status, body
    got, _, body = request(served, "/", host=host)  # nor the page
    assert got == status, body


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "0.0.0.0", "::1", "127.0.0.2"])
def test_every_loopback_binding_answers_to_a_name_of_its_own(tmp_path: Path, host: str) -> None:
    """The browser reaches each through loopback, where cookies would go to every port."""
    with Store(tmp_path / "c.db") as store:
        try:
            server = ViewerServer(Catalog(store), host)
        except InvalidArgument as error:  # no IPv6, or no 127.0.0.2, on this machine
            pytest.skip(str(error))
        server.server_close()
    assert re.fullmatch(URL, server.url), server.url


# ------------------------------------------------------------------ headers


@pytest.mark.parametrize("path", [*PATHS, "/missing", "/api/transcript?scope=x"])
def test_every_response_forbids_anything_remote(served: str, path: str) -> None:
    """CSP: only the viewer itself (and data: images); never sniffed, cached or framed."""
    _, headers, _ = request(served, path)
    policy = headers["Content-Security-Policy"]
    assert policy == CSP
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["img-src"] == "'self' data:"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert "http" not in policy and "*" not in policy and "unsafe" not in policy
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"
    assert headers["Cache-Control"] == "no-store"


@pytest.mark.parametrize("name", ["index.html", "app.js", "style.css"])
def test_the_page_loads_nothing_from_the_internet(name: str) -> None:
    """No remote script, style, font or image in the shipped files."""
    text = (STATIC / name).read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text and "//" + "cdn" not in text
    assert "@import" not in text and "url(" not in text and "@font-face" not in text


def test_app_js_never_writes_markup() -> None:
    """Stored data reaches the page through textContent only: no HTML-parsing sink at all."""
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("//"))
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in code, sink
    assert "textContent" in code


# -------------------------------------------------------------------- no write


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_write_methods_are_refused(served: str, method: str) -> None:
    """The viewer only reads: any other method is 405."""
    status, _, _ = request(served, "/api/conversations", method=method)
    assert status == 405


def test_serving_never_writes_the_database(tmp_path: Path, remote_images: CountingServer) -> None:
    """Bytes, mtime, rows and the folder's files are the same after a session of requests."""
    from ._viewer import build

    db = tmp_path / "chat.db"
    build(db, remote_images.server_address[1], long_size=10)
    files = sorted(p.name for p in tmp_path.iterdir())
    before = (db.read_bytes(), db.stat().st_mtime_ns, snapshot(db))
    with serving(db) as (url, process):
        for path in PATHS:
            assert request(url, path)[0] == 200
        page = api(url, f"/api/transcript?{address_query(PAGED, limit=10)}")
        api(url, f"/api/transcript?{address_query(PAGED, limit=10, before=page['before'])}")
        for method in ("POST", "PUT", "DELETE"):
            request(url, "/api/transcript", method=method)
        modes = _open_modes(process.pid, db)
        assert modes and set(modes) == {os.O_RDONLY}, modes  # the file is opened read-only
    # SQLite's read-only open of a WAL database makes the shared-memory index (-shm)
    # and an empty log, so that it can read while the application writes; the log
    # stays empty: nothing was written.
    after = sorted(p.name for p in tmp_path.iterdir())
    assert set(after) - set(files) <= {"chat.db-shm", "chat.db-wal"}, after
    wal = tmp_path / "chat.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    assert (db.read_bytes(), db.stat().st_mtime_ns, snapshot(db)) == before


def _open_modes(pid: int, path: Path) -> list[int]:
    """The access modes of the process's open descriptors on ``path`` (Linux /proc)."""
    folder = Path(f"/proc/{pid}/fd")
    if not folder.exists():
        pytest.skip("no /proc to read the open file's mode from")
    modes = []
    for fd in folder.iterdir():
        try:
            if os.path.realpath(fd) != str(path.resolve()):
                continue
            info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
        except OSError:
            continue
        flags = int(re.search(r"flags:\s+(\d+)", info).group(1), 8)  # type: ignore[union-attr]
        modes.append(flags & os.O_ACCMODE)
    return modes


def test_serve_refuses_a_missing_file_and_creates_none(tmp_path: Path) -> None:
    """A read-only viewer cannot create a database: one Error line, exit 2, no file."""
    missing = tmp_path / "nothing-here.db"
    result = CliRunner().invoke(cli, ["serve", "--no-browser", "--db", str(missing)])
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ") and "does not exist" in result.stderr
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("", "--host must name an address"),  # "" would be every interface
        ("\u202eevil", "--host '\\u202eevil' is not an address"),  # failed in socket: TypeError
        ("local host", "--host 'local host' is not an address"),
        ("no-such-host.invalid", "cannot listen on no-such-host.invalid:0"),
        ("192.0.2.1", "cannot listen on 192.0.2.1:0"),  # not an address of this machine
    ],
)
def test_serve_refuses_an_address_it_cannot_listen_on(
    viewer_db: Path, host: str, message: str
) -> None:
    """Each gets one Error line and exit 2, before anything is printed on stdout."""
    result = CliRunner().invoke(
        cli, ["serve", "--no-browser", "--db", str(viewer_db), "--host", host]
    )
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(f"Error: {message}"), result.stderr


def test_serve_refuses_a_port_in_use(viewer_db: Path, served: str) -> None:
    """The port of a running viewer: one Error line, exit 2."""
    port = str(urllib.parse.urlsplit(served).port)
    result = CliRunner().invoke(
        cli, ["serve", "--no-browser", "--db", str(viewer_db), "--port", port]
    )
    assert result.exit_code == 2 and result.stderr.startswith("Error: cannot listen on")


def test_postgresql_is_served_through_read_only_transactions(postgresql_url: str) -> None:
    """The viewer's connections refuse writes (default_transaction_read_only); reads work."""
    with Store(postgresql_url) as store:
        store.buffer(*AGENT).append({"role": "user", "content": "hi"})
    with open_read_only(postgresql_url) as store:
        page = Catalog(store).transcript(AGENT)
        assert [e["content"] for e in page["entries"]] == [[{"kind": "text", "text": "hi"}]]
        with pytest.raises(ReadOnlyStore, match="read-only transaction"):
            store.buffer(*AGENT).append({"role": "user", "content": "written?"})
    with Store(postgresql_url) as store:
        assert len(store.buffer(*AGENT)) == 1


# ------------------------------------------------------------ stored text is text


def test_stored_markup_is_escaped_in_the_json(served: str) -> None:
    """No '<' leaves the server raw; the parsed JSON holds the stored text exactly."""
    status, headers, body = request(served, f"/api/transcript?{address_query(XSS)}")
    assert status == 200 and b"<" not in body and b">" not in body
    assert headers["X-Content-Type-Options"] == "nosniff"
    page = json.loads(body)
    user, assistant = page["entries"]
    assert user["content"] == [{"kind": "text", "text": SCRIPT}]
    (call,) = assistant["calls"]
    assert (call["id"], call["name"], call["arguments"]) == ("<b>id</b>", "<i>tool</i>", SCRIPT)
    assert call["result"]["content"] == [{"kind": "text", "text": SCRIPT}]


def test_a_remote_image_is_a_link_and_a_data_image_is_shown(
    served: str, remote_images: CountingServer
) -> None:
    """The page is given the remote URL as text (a link part), never as an image to load."""
    port = remote_images.server_address[1]
    page = api(served, f"/api/transcript?{address_query(AGENT)}")
    parts = [part for entry in page["entries"] for part in entry["content"]]
    assert {"kind": "image", "src": PIXEL} in parts
    assert {"kind": "link", "text": remote_image_url(port), "label": "image"} in parts
    assert not [p for p in parts if p["kind"] == "image" and not p["src"].startswith("data:")]
    assert remote_images.hits == []  # the server itself fetched nothing


# ---------------------------------------------------------------- the transcript


def test_transcript_is_in_position_order_with_calls_next_to_results(served: str) -> None:
    """Roles in order; each call holds its arguments and its result; marks as the buffer is."""
    page = api(served, f"/api/transcript?{address_query(AGENT)}")
    entries = page["entries"]
    assert page["count"] == 10 and page["before"] is None
    assert [e["role"] for e in entries] == [
        "system", "user", "assistant", "user", "assistant", "user", "assistant", "user",
    ]  # fmt: skip
    assert [e["position"] for e in entries] == sorted(e["position"] for e in entries)
    weather = entries[2]["calls"][0]
    assert weather["name"] == "get_forecast"
    assert json.loads(weather["arguments"]) == {"city": "Lisbon", "day": "tomorrow"}
    # The placeholder a late result replaced (MEM-10) is that result, not interrupted.
    assert weather["result"]["content"] == [{"kind": "text", "text": "Rain, 14 C, 80%"}]
    assert weather["result"]["interrupted"] is False
    radar = entries[4]["calls"][0]
    assert json.loads(radar["arguments"]) == {"km": 50}
    assert radar["result"]["interrupted"] is True  # the healed placeholder (MEM-3)
    assert not any(e["interrupted"] for e in entries)
    assert all(e["role"] != "tool" for e in entries)  # results are drawn with their calls


def test_a_result_whose_call_is_not_shown_stands_alone() -> None:
    """A tool message without its call among the messages says which call it answers."""
    with Store(":memory:") as store:
        buffer = store.buffer(*AGENT)
        buffer.append(
            [
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f"}]},
                {"role": "tool", "tool_call_id": "c1", "content": "late"},
            ]
        )
        (result,) = transcript(buffer.messages()[1:])
    assert (result["role"], result["answers"], result["calls"]) == ("tool", "c1", [])


def test_a_page_never_starts_inside_a_turns_results(served: str) -> None:
    """Two messages asked, the page widens back to the call so results sit next to it."""
    page = api(served, f"/api/transcript?{address_query(WIDEN, limit=2)}")
    first = page["entries"][0]
    assert first["role"] == "assistant"
    assert [c["result"]["content"][0]["text"] for c in first["calls"]] == ["r0", "r1", "r2"]
    assert page["before"] is not None  # the user turn before it is the previous page


def test_paging_back_walks_to_the_start_in_order(served: str) -> None:
    """``before`` pages cover the history once, in order, and the last says there is no more."""
    seen: list[str] = []
    before = ""
    pages = 0
    while True:
        page = api(served, f"/api/transcript?{address_query(PAGED, limit=100, before=before)}")
        seen[:0] = [e["content"][0]["text"] for e in page["entries"]]
        pages += 1
        if page["before"] is None:
            break
        before = page["before"]
    assert pages == 3 and seen == [f"message {i}" for i in range(PAGED_SIZE)]


def test_last_page_of_100_000_messages_in_under_a_second(served: str) -> None:
    """Opening the long conversation is one indexed read of its last page, not of its history."""
    started = time.perf_counter()
    page = api(served, f"/api/transcript?{address_query(LONG)}")
    elapsed = time.perf_counter() - started
    assert page["count"] == LONG_SIZE and len(page["entries"]) == 100
    assert page["entries"][-1]["content"][0]["text"] == f"long message {LONG_SIZE - 1}"
    older = api(served, f"/api/transcript?{address_query(LONG, before=page['before'])}")
    assert older["entries"][-1]["content"][0]["text"] == f"long message {LONG_SIZE - 101}"
    assert elapsed < 1.0, f"{elapsed:.3f} s"


@pytest.mark.parametrize(
    ("query", "status", "error"),
    [
        (address_query(AGENT, before="no-such-id"), 404, "no message 'no-such-id'"),
        ("scope=demo&scope_id=local", 400, "missing query parameter 'key'"),
        (address_query(AGENT, limit="ten"), 400, "limit must be a whole number"),
        (address_query(AGENT, limit="-1"), 400, "limit must be a whole number"),
        ("scope=&scope_id=x&key=k", 400, "scope"),
    ],
)
def test_bad_transcript_requests_are_errors_not_crashes(
    served: str, query: str, status: int, error: str
) -> None:
    """Each bad request gets its status and a one-line JSON error."""
    got, _, body = request(served, f"/api/transcript?{query}")
    assert got == status and error in json.loads(body)["error"], body


# ------------------------------------------------------------------ conversations


def test_conversations_are_listed_newest_first_and_paged(served: str) -> None:
    """Address, count and last update; the cursor pages through all of them once."""
    first = api(served, "/api/conversations?limit=2")
    assert len(first["items"]) == 2 and first["next"]
    newest = first["items"][0]
    assert set(newest) == {"address", "title", "count", "updated_at"}
    known = {AGENT: 10, LONG: 100_000}
    assert newest["count"] == known.get(tuple(newest["address"]), newest["count"])
    rest = api(served, f"/api/conversations?limit=10&after={first['next']}")
    assert rest["next"] is None
    items = first["items"] + rest["items"]
    assert {tuple(i["address"]) for i in items} == {AGENT, XSS, WIDEN, PAGED, LONG}
    stamps = [i["updated_at"] for i in items]
    assert stamps == sorted(stamps, reverse=True)


@pytest.mark.parametrize("after", ["x", "-1", "\u00b2", "9" * 40])
def test_a_cursor_the_viewer_did_not_give_is_refused(served: str, after: str) -> None:
    """A bad ``after`` is a 400, not a crash."""
    query = urllib.parse.urlencode({"after": after})
    status, _, body = request(served, f"/api/conversations?{query}")
    assert status == 400 and "not a cursor" in json.loads(body)["error"]


# ------------------------------------------------------------------------ search


def test_search_says_how_to_enable_it(served: str) -> None:
    """Without store.search (or with search off) the endpoint returns the hint, no hits."""
    assert api(served, "/api/search?q=rain") == {"enabled": False, "hint": SEARCH_HINT, "hits": []}
    assert SEARCH_HINT == "search is not enabled: run `flowdrop-local search --enable`"


class _Hit:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class _SearchingStore(Store):
    """A store with the search API the viewer expects (until issue 13's search lands)."""

    enabled = True
    calls: list[tuple[str, dict[str, Any]]]

    def search_enabled(self) -> bool:
        return self.enabled

    def search(self, query: str, **options: Any) -> list[Any]:
        self.calls.append((query, options))
        return [
            {
                "address": AGENT,
                "message_id": "m1",
                "role": "tool",
                "snippet": "heavy <mark>rain</mark> & <script>x</script>",
                "score": 1.5,
            },
            _Hit(address=_Hit(scope="s", scope_id="i", key="k"), message_id="m2", role="user",
                 snippet="\x02rain\x03 coat", score=0.5),
        ]  # fmt: skip


def test_search_hits_are_passed_through_with_marked_terms_as_segments() -> None:
    """Dict or object hits become {address, message_id, role, segments, score}, best first."""
    with _SearchingStore(":memory:") as store:
        store.calls = []
        result = Catalog(store).search("rain", key="weather-agent", limit=5)
        assert store.calls == [
            ("rain", {"scope": None, "scope_id": None, "key": "weather-agent", "limit": 5})
        ]
        store.enabled = False
        assert Catalog(store).search("rain")["hint"] == SEARCH_HINT
    assert result["enabled"] is True
    first, second = result["hits"]
    assert first["address"] == list(AGENT) and first["score"] == 1.5
    assert first["segments"] == [
        {"text": "heavy ", "mark": False},
        {"text": "rain", "mark": True},
        {"text": " & <script>x</script>", "mark": False},  # text, drawn as text
    ]
    assert second["address"] == ["s", "i", "k"]
    assert second["segments"] == [{"text": "rain", "mark": True}, {"text": " coat", "mark": False}]


def test_search_hits_reach_the_page_escaped() -> None:
    """Through a live server: the hit JSON carries the snippet as escaped text."""
    with _SearchingStore(":memory:") as store:
        store.calls = []
        server = ViewerServer(Catalog(store))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            status, _, body = request(server.url, "/api/search?q=rain&limit=3")
        finally:
            server.shutdown()
            server.server_close()
    assert status == 200 and b"<" not in body
    assert json.loads(body)["hits"][0]["segments"][2]["text"] == " & <script>x</script>"


@pytest.mark.parametrize(
    ("snippet", "segments"),
    [
        ("", []),
        ("plain", [("plain", False)]),
        ("<mark>a</mark><mark>b</mark>", [("a", True), ("b", True)]),
        ("x <mark>unclosed", [("x <mark>unclosed", False)]),
        ("<b>not a mark</b>", [("<b>not a mark</b>", False)]),
    ],
)
def test_snippet_segments(snippet: str, segments: list[tuple[str, bool]]) -> None:
    """Only <mark>...</mark> (or \\x02...\\x03) pairs are marks; everything else is text."""
    assert snippet_segments(snippet) == [{"text": t, "mark": m} for t, m in segments]


# ------------------------------------------------------------ the catalog directly


def test_catalog_refuses_bad_arguments(viewer_db: Path) -> None:
    """A negative limit and an unknown ``before`` are the library's own errors."""
    with open_read_only(str(viewer_db)) as store:
        catalog = Catalog(store)
        with pytest.raises(InvalidArgument):
            catalog.conversations(limit=-1)
        with pytest.raises(MessageNotFound):
            catalog.transcript(AGENT, before="nope")


def test_a_folder_opened_read_only_is_not_a_database(tmp_path: Path) -> None:
    """Store(folder, read_only=True) raised sqlite3.OperationalError; now NotADatabase."""
    with pytest.raises(NotADatabase, match="is a folder, not a regular file"):
        Store(tmp_path, read_only=True)
    result = CliRunner().invoke(cli, ["serve", "--no-browser", "--db", str(tmp_path)])
    assert result.exit_code == 2 and result.stderr.startswith("Error: ")
    assert "is a folder, not a regular file" in result.stderr


def test_open_read_only_refuses_to_create(tmp_path: Path) -> None:
    """No file is made for a missing path."""
    with pytest.raises(ReadOnlyStore), open_read_only(str(tmp_path / "new.db")):
        pass
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------- packaging


@pytest.mark.timeout(180)
def test_wheel_ships_the_page(tmp_path: Path) -> None:
    """The built wheel holds the viewer's static files, byte for byte."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for name in ("index.html", "app.js", "style.css"):
            packaged = archive.read(f"flowdrop_local/viewer/static/{name}")
            assert packaged == (STATIC / name).read_bytes()


# ------------------------------------------------------------------- notebooks


class _Parsed(html.parser.HTMLParser):
    """Tags (with attributes) and text, in order, as a browser's parser sees them."""

    def __init__(self, markup: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        if self.lasttag != "style":  # the stylesheet is not text a person reads
            self.text.append(data)


def _notebook(viewer_db: Path, address: tuple[str, str, str]) -> tuple[str, _Parsed]:
    with Store(viewer_db, read_only=True) as store:
        markup = store.buffer(*address)._repr_html_()
    return markup, _Parsed(markup)


def test_notebook_transcript_has_the_pages_marks(
    viewer_db: Path, remote_images: CountingServer
) -> None:
    """Same entries as the page: calls beside results, one interrupted mark, the data image."""
    markup, parsed = _notebook(viewer_db, AGENT)
    classes = [attrs.get("class") for _, attrs in parsed.tags]
    roles = [c.split()[1] for c in classes if c and c.startswith("fd-msg ")]
    assert roles == ["fd-system", "fd-user", "fd-assistant"] + ["fd-user", "fd-assistant"] * 2 + [
        "fd-user"
    ]
    assert classes.count("fd-interrupted") == 1 and classes.count("fd-call") == 2
    text = "".join(parsed.text)
    assert text.index("get_forecast") < text.index("Rain, 14 C, 80%") < text.index("radar")
    assert text.index("radar") < text.index("interrupted") < text.index("Take an umbrella")
    images = [attrs["src"] for tag, attrs in parsed.tags if tag == "img"]
    assert images == [PIXEL]
    assert remote_image_url(remote_images.server_address[1]) in text  # as text, not a source
    assert "demo / local / weather-agent (10 messages)" in text
    assert "<script" not in markup and "http" not in "".join(
        str(v) for _, attrs in parsed.tags for v in attrs.values()
    )


def test_notebook_transcript_escapes_stored_markup(viewer_db: Path) -> None:
    """Stored <script>, <img onerror> and markup in call ids and names come out as text."""
    markup, parsed = _notebook(viewer_db, XSS)
    tags = {tag for tag, _ in parsed.tags}
    assert tags <= {"style", "div", "span", "pre", "b"}, tags
    assert not [attrs for _, attrs in parsed.tags if any(k.startswith("on") for k in attrs)]
    text = "".join(parsed.text)
    assert text.count(SCRIPT) == 3 and "<i>tool</i>" in text and "<b>id</b>" in text
    assert "<script" not in markup and "<img" not in markup


@pytest.mark.parametrize(
    "src",
    [
        'data:image/png;base64,AAAA"><script>alert(1)</script>',
        "data:image/svg+xml,<svg onload=alert(1)>",
        "javascript:alert(1)",
        "data:text/html,<script>alert(1)</script>",
    ],
)
def test_notebook_image_sources_cannot_break_out(src: str) -> None:
    """A hostile image URL is a quoted attribute of an <img> (data:image/ only), or text."""
    with Store(":memory:") as store:
        buffer = store.buffer(*AGENT)
        part = {"type": "image_url", "image_url": {"url": src}}
        buffer.append({"role": "user", "content": [part]})
        parsed = _Parsed(buffer._repr_html_())
    images = [attrs["src"] for tag, attrs in parsed.tags if tag == "img"]
    assert images == ([src] if src.startswith("data:image/") else [])
    assert [tag for tag, _ in parsed.tags if tag in ("script", "svg", "a", "iframe")] == []
    if not images:
        assert src in "".join(parsed.text)


def test_notebook_shows_the_last_200_of_a_long_history(viewer_db: Path) -> None:
    """A long buffer renders only its last messages, and says so."""
    _, parsed = _notebook(viewer_db, PAGED)
    text = "".join(parsed.text)
    assert "the last 200 of 250 messages" in text
    assert "message 49" not in text.split("message 50", 1)[0]
    assert text.rstrip().endswith(f"message {PAGED_SIZE - 1}")


def test_notebook_of_an_empty_or_refused_buffer() -> None:
    """An empty buffer and a refused one render a heading and no messages."""
    with Store(":memory:") as store:
        for buffer in (store.buffer(*AGENT), store.buffer("user", "0", "chat")):
            parsed = _Parsed(buffer._repr_html_())
            assert not [a for _, a in parsed.tags if (a.get("class") or "").startswith("fd-msg")]
            assert "(0 messages)" in "".join(parsed.text)


# ------------------------------------------------ Buffer.messages(before=), both backends


def test_messages_page_back_with_ids(store: Store) -> None:
    """messages(limit, before=id) is read(limit, before=id) with the ids the next page needs."""
    buffer = store.buffer(*AGENT)
    buffer.append([{"role": "user", "content": f"m{i}"} for i in range(10)])
    last = buffer.messages(3)
    older = buffer.messages(3, before=last[0].id)
    assert [m.content for m in older + last] == [f"m{i}" for i in range(4, 10)]
    assert [m.to_dict() for m in older] == buffer.read(3, before=last[0].id)
    assert [m.content for m in buffer.messages(before=older[0].id)] == [f"m{i}" for i in range(4)]
    assert buffer.messages(5, before=buffer.messages()[0].id) == []


@pytest.mark.parametrize(
    ("before", "error"),
    [
        ("no-such-id", MessageNotFound),  # not a message of this buffer
        (5, InvalidArgument),  # not a string
    ],
)
def test_messages_before_refuses_what_read_refuses(store: Store, before: Any, error: type) -> None:
    """The same errors as read(before=)."""
    buffer = store.buffer(*AGENT)
    buffer.append({"role": "user", "content": "x"})
    with pytest.raises(error):
        buffer.messages(1, before=before)
    with pytest.raises(error):
        buffer.read(1, before=before)


def test_catalog_lists_titles_and_real_search_hits(tmp_path: Path) -> None:
    """With the store's own listing and search: titles show, the newest conversation
    comes first, and a hit's matched term is a marked segment (the page draws text)."""
    from flowdrop_local import Store
    from flowdrop_local.viewer.catalog import Catalog

    with Store(tmp_path / "c.db") as store:
        old = store.buffer("chat", "u", "old")
        old.append({"role": "user", "content": "Trains to Porto [tomorrow]"})
        old.set_title("Porto")
        new = store.buffer("chat", "u", "new")
        new.append({"role": "user", "content": "Ferries in Lisbon"})
        new.set_title("Lisbon <b>trip</b>")
        catalog = Catalog(store)
        listed = catalog.conversations(limit=10)["items"]
        assert {item["title"] for item in listed} == {"Porto", "Lisbon <b>trip</b>"}
        assert listed[0]["address"] == ["chat", "u", "new"]  # created last: newest
        assert catalog.search("lisbon")["enabled"] is False
        store.enable_search()
        result = catalog.search("lisbon")
        assert result["enabled"] is True
        (hit,) = result["hits"]
        assert hit["address"] == ["chat", "u", "new"] and hit["role"] == "user"
        assert {"text": "Lisbon", "mark": True} in hit["segments"]
        assert "".join(s["text"] for s in hit["segments"]) == "Ferries in Lisbon"


def test_a_refused_request_ends_its_connection(served: str) -> None:
    """A client whose requests are all refused (a wrong Host, no cookie) cannot keep
    its connections open with keep-alive and so hold every slot (found by a review:
    32 such connections kept the owner at 503 for 40 s)."""
    import socket

    parts = urllib.parse.urlsplit(served)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection(("127.0.0.1", parts.port), timeout=10) as sock:
        sock.sendall(
            b"GET /api/conversations HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n"
        )
        received = b""
        while chunk := sock.recv(65536):  # the server closes after its answer
            received += chunk
        assert received.startswith(b"HTTP/1.") and b" 403 " in received.split(b"\r\n")[0]
