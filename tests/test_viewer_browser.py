"""The viewer in a real browser: Playwright driving Debian's headless Chromium.

The browser is the system's (``/usr/bin/chromium``, or ``$FLOWDROP_CHROMIUM``);
Playwright never downloads one. Without it (or without the ``playwright``
package) these tests skip, unless ``FLOWDROP_REQUIRE_BROWSER`` is set (CI sets
it), which turns the skip into a failure. One browser and one ``serve`` process
serve the whole module (Chromium takes about 2 s to start).

Screenshots go to ``$FLOWDROP_ARTIFACTS`` (else ``tests/artifacts/``, git-ignored);
``FLOWDROP_UPDATE_SCREENSHOT=1`` also rewrites the README's ``docs/viewer.png``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

from flowdrop_local.viewer.catalog import SEARCH_HINT

from ._viewer import (
    LONG_SIZE,
    PAGED_SIZE,
    PIXEL_SIZE,
    SCRIPT,
    CountingServer,
    artifacts,
    remote_image_url,
    serving,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = os.environ.get("FLOWDROP_CHROMIUM", "/usr/bin/chromium")
DOCS_SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "viewer.png"


def _no_browser(reason: str) -> NoReturn:
    if os.environ.get("FLOWDROP_REQUIRE_BROWSER"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium from the system, started once for the module."""
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as error:
        _no_browser(f"no browser: the playwright package is missing ({error})")
    if not os.access(CHROMIUM, os.X_OK):
        _no_browser(f"no browser: {CHROMIUM} not found (apt-get install chromium)")
    with sync_playwright() as playwright:
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
    """A fresh page at the printed URL; fails the test on any dialog or CSP report."""
    context = browser.new_context(viewport={"width": 1180, "height": 820})
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
    page.goto(url)
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
