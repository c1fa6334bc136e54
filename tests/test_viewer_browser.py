"""The viewer in a real browser: Playwright driving Debian's headless Chromium.

The browser is the system's (``/usr/bin/chromium``, or ``$FLOWDROP_CHROMIUM``);
Playwright never downloads one. Without it (or without the ``playwright``
package) these tests skip, unless ``FLOWDROP_REQUIRE_BROWSER`` is set (CI sets
it), which turns the skip into a failure. One browser and one ``serve`` process
serve the whole module (Chromium takes about 2 s to start).

Screenshots go to ``$FLOWDROP_ARTIFACTS`` (else ``tests/artifacts/``, git-ignored);
``FLOWDROP_UPDATE_SCREENSHOT=1`` also rewrites the docs' ``docs/viewer.png``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

from flowdrop_local.viewer.catalog import SEARCH_HINT, Catalog
from flowdrop_local.viewer.server import ViewerServer, open_read_only

from ._viewer import (
    LONG_SIZE,
    PAGED_SIZE,
    PIXEL_SIZE,
    SCRIPT,
    CountingServer,
    artifacts,
    counting_server,
    origin,
    remote_image_url,
    replay,
    serving,
    session_cookie,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Playwright

CHROMIUM = os.environ.get("FLOWDROP_CHROMIUM", "/usr/bin/chromium")
DOCS_SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "viewer.png"


def _no_browser(reason: str) -> NoReturn:
    if os.environ.get("FLOWDROP_REQUIRE_BROWSER"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _chromium() -> None:
    if not os.access(CHROMIUM, os.X_OK):
        _no_browser(f"no browser: {CHROMIUM} not found (apt-get install chromium)")


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    """Playwright, for the system's Chromium only."""
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        _no_browser(f"no browser: the playwright package is missing ({error})")
    _chromium()
    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Headless Chromium from the system, started once for the module."""
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture(scope="module")
def url(viewer_db: Path) -> Iterator[str]:
    """The first line ``flowdrop-local serve --no-browser`` printed."""
    with serving(viewer_db) as (line, _):
        yield line


@pytest.fixture
def page(browser: Browser, url: str) -> Iterator[Page]:
    """A fresh page of the viewer; fails the test on any dialog or CSP report.

    The printed link works once, so each page's browser context is given the
    cookie that link gave (as a browser that opened it holds it).
    """
    context = browser.new_context(viewport={"width": 1180, "height": 820})
    name, _, value = session_cookie(url).partition("=")
    context.add_cookies([{"name": name, "value": value, "url": origin(url) + "/"}])
    page = context.new_page()
    problems: list[str] = []
    page.on("dialog", lambda dialog: problems.append(f"dialog: {dialog.message}"))
    page.on(
        "console",
        lambda message: problems.append(message.text)
        if "Content Security Policy" in message.text or message.type == "error"
        else None,
    )
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.goto(origin(url) + "/")
    page.wait_for_selector("#conversations .open")
    try:
        yield page
        assert problems == []
    finally:
        context.close()


def _open(page: Page, key: str) -> None:
    page.locator("#conversations .open", has_text=key).click()
    page.wait_for_selector("#transcript .message")


def _texts(page: Page, selector: str) -> list[str]:
    texts: list[str] = page.locator(selector).all_text_contents()
    return texts


def test_transcript_with_calls_results_marks_and_images(
    page: Page, remote_images: CountingServer
) -> None:
    """Click a conversation: roles in order, each call beside its result, the interrupted mark."""
    from playwright.sync_api import expect

    titles = _texts(page, "#conversations .open .title")
    assert "demo / local / weather-agent" in titles  # newest first: store.conversations()
    assert len(titles) == 5
    _open(page, "weather-agent")
    roles = _texts(page, "#transcript > .message > .head > .role")
    assert roles == ["system", "user", "assistant"] + ["user", "assistant"] * 2 + ["user"]
    assert _texts(page, "#transcript > .message > .content > .text")[0].startswith("You are")
    assert _texts(page, "#transcript > .message > .content > .text")[-1] == "Thanks!"
    weather = page.locator(".call", has_text="get_forecast")
    assert '"city": "Lisbon"' in weather.locator(".arguments").text_content()  # type: ignore[operator]
    assert weather.locator(".result .text").text_content() == "Rain, 14 C, 80%"
    assert weather.locator(".interrupted").count() == 0  # replaced by its late result
    radar = page.locator(".call", has_text="radar")
    assert radar.locator(".result .interrupted").text_content() == "interrupted"
    assert radar.locator(".result .interrupted").is_visible()
    # The data: image is drawn; the remote one is its address as text, never fetched.
    image = page.locator("img.image")
    assert image.count() == 1
    expect(image).to_have_js_property("complete", True)
    assert image.evaluate("img => [img.naturalWidth, img.naturalHeight]") == list(PIXEL_SIZE)
    port = remote_images.server_address[1]
    assert page.locator(".link .url").text_content() == remote_image_url(port)
    page.screenshot(path=str(artifacts() / "viewer-transcript.png"))
    if os.environ.get("FLOWDROP_UPDATE_SCREENSHOT"):
        DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(DOCS_SCREENSHOT))
    assert remote_images.hits == []


def test_stored_script_is_shown_as_text(page: Page) -> None:
    """A message holding <script> and an onerror <img> shows their text and runs nothing."""
    _open(page, "hostile")
    assert _texts(page, "#transcript .message .content > .text")[0] == SCRIPT
    call = page.locator(".call")
    assert call.locator(".name").text_content() == "<i>tool</i>"
    assert call.locator(".arguments").text_content() == SCRIPT
    assert call.locator(".result .text").text_content() == SCRIPT
    assert page.evaluate("window.__pwned") is None
    markup = "#transcript script, #transcript img, #transcript i, #transcript b"
    assert page.locator(markup).count() == 0
    page.screenshot(path=str(artifacts() / "viewer-hostile.png"))


def test_search_says_how_to_enable_it(page: Page) -> None:
    """Until search is enabled, the search box answers with the command that enables it."""
    page.fill("#search", "umbrella")
    page.press("#search", "Enter")
    hint = page.locator("#search-hint")
    hint.wait_for(state="visible")
    assert hint.text_content() == SEARCH_HINT
    page.screenshot(path=str(artifacts() / "viewer-search.png"))


def test_page_back_to_the_start(page: Page) -> None:
    """The last 100 first; "Older messages" prepends pages until the start, order kept."""
    from playwright.sync_api import expect

    _open(page, "paged")
    messages = "#transcript .message .content > .text"
    assert _texts(page, messages) == [f"message {i}" for i in range(150, PAGED_SIZE)][-100:]
    for shown in (200, PAGED_SIZE):
        page.click("#older")
        expect(page.locator("#transcript .message")).to_have_count(shown)
    assert _texts(page, messages) == [f"message {i}" for i in range(PAGED_SIZE)]
    assert page.locator("#older").is_hidden() and page.locator("#start").is_visible()
    page.screenshot(path=str(artifacts() / "viewer-paged.png"))


def test_a_100_000_message_conversation_shows_its_last_page_in_under_a_second(
    page: Page,
) -> None:
    """From the click to the last message drawn, in the browser."""
    started = time.perf_counter()
    _open(page, "history")
    last = page.locator("#transcript .message .content > .text").last
    assert last.text_content() == f"long message {LONG_SIZE - 1}"
    elapsed = time.perf_counter() - started
    assert page.locator("#conversation-count").text_content() == (
        f"{LONG_SIZE} messages, 100 shown"
    )
    assert elapsed < 1.0, f"{elapsed:.3f} s"


# ------------------------------------------------- the token stays with the viewer


def test_a_page_on_another_local_port_gets_no_cookie_and_no_data(
    browser: Browser, viewer_db: Path
) -> None:
    """Cookies ignore ports: after the printed link, another local server sees none of ours.

    The browser opens the printed URL, then goes to a server of another process on
    127.0.0.1 and on localhost (any local user can listen there). That server must
    receive no viewer cookie, and whatever it did receive opens no data.
    """
    with serving(viewer_db) as (line, _), counting_server() as other:
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(line)
            page.wait_for_selector("#conversations .open")
            port = other.server_address[1]
            for name in ("127.0.0.1", "localhost"):
                page.goto(f"http://{name}:{port}/")
        finally:
            context.close()
        assert len(other.cookies) >= 2
        assert [c for c in other.cookies if "flowdrop" in c] == []
        for cookie in {c for c in other.cookies if c}:
            assert replay(origin(line) + "/", cookie) == 403


def test_the_address_bar_and_the_history_hold_no_way_in(
    playwright: Playwright, viewer_db: Path, tmp_path: Path
) -> None:
    """After the printed link, the address bar is the bare page, and every address the
    browser's history database (Chromium's ``History``) holds opens no data."""
    profile = tmp_path / "profile"
    with serving(viewer_db) as (line, _):
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True
        )
        try:
            page = context.new_page()
            page.goto(line)
            page.wait_for_selector("#conversations .open")
            assert page.url == origin(line) + "/"
            assert page.evaluate("location.search + location.hash") == ""
        finally:
            context.close()
        with sqlite3.connect(profile / "Default" / "History") as history:
            urls = [row[0] for row in history.execute("SELECT url FROM urls")]
        port = urllib.parse.urlsplit(line).port
        ours = [u for u in urls if urllib.parse.urlsplit(u).port == port]
        assert ours, urls  # the history was recorded
        for address in ours:
            assert replay(address) == 403, address


def test_the_launch_page_opens_the_viewer(browser: Browser, viewer_db: Path) -> None:
    """The ``file:`` page ``serve`` opens the browser on leads to the viewer with its data
    (a navigation from a file is cross-site: the data still comes, the page is bare)."""
    with open_read_only(str(viewer_db)) as store:
        server = ViewerServer(Catalog(store))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(server.write_launch_page().as_uri())
            page.wait_for_selector("#conversations .open")
            assert page.url == server.origin + "/"
            assert server.launch_page is None  # used, so removed
        finally:
            context.close()
            server.shutdown()
            server.server_close()


def _processes_with(marker: str) -> dict[int, list[str]]:
    """The command lines (argument lists) of this machine's processes that hold ``marker``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(marker in arg for arg in args):
            found[int(entry.name)] = args
    return found


def test_the_launched_browser_command_line_holds_no_secret(
    viewer_db: Path, tmp_path: Path
) -> None:
    """Any local user reads ``/proc/<pid>/cmdline``: the browser ``serve`` starts (through
    ``$BROWSER``, as ``webbrowser`` does) is given no part of the printed link's secret,
    and still opens the viewer; the printed link then still works."""
    _chromium()
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("no /proc")
    profile = tmp_path / "launched-profile"
    launcher = tmp_path / "browser"  # the system's Chromium, headless, in its own profile
    launcher.write_text(
        f'#!/bin/sh\nexec {CHROMIUM} --headless --no-sandbox --disable-gpu '
        f'--user-data-dir={profile} "$@"\n'
    )
    launcher.chmod(0o755)
    env = {**os.environ, "BROWSER": str(launcher)}
    with serving(viewer_db, browser=True, env=env) as (line, _):
        parts = urllib.parse.urlsplit(line)
        secrets = [v for values in urllib.parse.parse_qs(parts.query).values() for v in values]
        assert parts.hostname is not None
        if parts.hostname.endswith(".localhost"):  # a per-launch name is a secret too
            secrets.append(parts.hostname.removesuffix(".localhost"))
        assert secrets and all(len(s) >= 16 for s in secrets)
        found: dict[int, list[str]] = {}
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not found:
                found = _processes_with(str(profile))
                time.sleep(0.1)
            assert found, "the browser did not start"
            opened = [a for args in found.values() for a in args if "://" in a]
            assert opened, found
            for args in found.values():
                for secret in secrets:
                    assert not [a for a in args if secret in a], (secret, args)
            # What it was given is the page that opened the viewer; once used, it is gone.
            (page,) = {urllib.parse.urlsplit(a).path for a in opened if a.startswith("file:")}
            while time.monotonic() < deadline and Path(page).exists():
                time.sleep(0.1)
            assert not Path(page).exists(), "the browser never opened the viewer"
            assert replay(line) == 200  # the printed link was not used up by the browser
        finally:
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
