"""The playground in a real browser (headless Chromium through Playwright).

Type a prompt, press Generate, wait for streamed text, click a token, and check that the
attention view shows one panel per head of the model, with nothing loaded from outside the
server. Skipped cleanly where Playwright or a Chromium binary is missing (`make test` installs
them where it can). Set LAMINA_SCREENSHOT to a path to keep the screenshot.
"""

from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
sync_api = pytest.importorskip("playwright.sync_api")

from serving import live_server, tiny_model  # noqa: E402

from lamina.native import build  # noqa: E402
from lamina.serve import Engine, Limits  # noqa: E402


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium binary (apt-get install -y chromium)")


def test_generate_stream_click_a_token_and_see_every_head(tmp_path):
    exe = chromium()
    build.library()  # a session's first native use builds decode.c (~20 s): not inside the waits
    model, tok = tiny_model()
    engine = Engine(model, tok, Limits(max_tokens=60))
    heads = model.config.n_layers * model.config.n_heads
    with live_server(engine) as (host, port), sync_api.sync_playwright() as p:
        base = f"http://{host}:{port}"
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            outside: list[str] = []
            page.on("request", lambda r: None if r.url.startswith(base) else outside.append(r.url))
            page.goto(base + "/", timeout=10_000)
            page.wait_for_function(
                "document.getElementById('model-info').textContent.length > 0", timeout=5_000
            )
            page.fill("#prompt", "ROMEO:\n")
            page.fill("#max_tokens", "40")
            page.fill("#seed", "3")
            page.click("#generate")
            page.wait_for_selector("#output .tok.gen", timeout=10_000)  # streamed text
            page.wait_for_selector("#output.ready .tok[data-pos='8']", timeout=10_000)
            text = page.inner_text("#output")
            assert text.startswith("ROMEO:") and len(text) > len("ROMEO:\n") + 10
            page.click("#output .tok[data-pos='8']")
            page.wait_for_selector("#inspector:not([hidden]) .head", timeout=5_000)
            assert page.locator("#heads .head").count() == heads
            assert page.locator("#heads .head").first.locator(".key").count() == 9  # keys 0..8
            assert page.locator("#alternatives table.alts").count() == 2
            assert "position 8" in page.inner_text("#inspector-title")
            shot = os.environ.get("LAMINA_SCREENSHOT") or str(tmp_path / "playground.png")
            page.screenshot(path=shot, full_page=True)
            assert os.path.getsize(shot) > 10_000
            assert outside == []
        finally:
            browser.close()
