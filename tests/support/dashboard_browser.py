"""The dashboard in Debian's chromium (Playwright) against an app served on a thread:
what the unit tests of the dashboard's panels share."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

CHROMIUM = Path("/usr/bin/chromium")
#: headless, and nothing fetched from the network
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _serve(app: web.Application, ready: threading.Event, box: dict) -> None:
    async def main() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["port"] = runner.addresses[0][1]
        box["stop"] = asyncio.Event()
        ready.set()
        await box["stop"].wait()
        await runner.cleanup()

    box["loop"] = asyncio.new_event_loop()
    box["loop"].run_until_complete(main())


@contextmanager
def dashboard_page(app: web.Application) -> Iterator[tuple[Any, list[str]]]:
    """``(page, errors)``: ``/dashboard`` of ``app`` open in chromium (1440 x 1000) after
    its first snapshot, and the page's JavaScript errors so far."""
    from playwright.sync_api import sync_playwright

    ready, box = threading.Event(), {}
    server = threading.Thread(target=_serve, args=(app, ready, box), daemon=True)
    server.start()
    assert ready.wait(30)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"http://127.0.0.1:{box['port']}/dashboard")
            page.wait_for_function("Number(document.body.dataset.snapshots || 0) >= 1")
            yield page, errors
            browser.close()
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        server.join(10)
