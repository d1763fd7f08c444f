"""The chat page in a real browser (headless Chromium through Playwright): a two-turn
conversation, each reply equal to a fresh render of the conversation, the second one served
mostly from the server's KV cache. Skipped cleanly without Playwright or Chromium."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("starlette")
sync_api = pytest.importorskip("playwright.sync_api")

from chat_fixtures import chat_engine, fresh_reply  # noqa: E402
from serving import live_server  # noqa: E402
from test_serve_browser import chromium  # noqa: E402


def test_two_turns_on_the_chat_page():
    exe = chromium()
    engine = chat_engine(max_tokens=12)
    with live_server(engine) as (host, port), sync_api.sync_playwright() as p:
        base = f"http://{host}:{port}"
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            outside: list[str] = []
            page.on("request", lambda r: None if r.url.startswith(base) else outside.append(r.url))
            page.goto(base + "/chat", timeout=10_000)
            page.fill("#system", "Be brief.")
            page.fill("#max_tokens", "12")
            said: list[dict] = [{"role": "system", "content": "Be brief."}]
            for turn, question in enumerate(["Hello there", "And then?"]):
                page.fill("#message", question)
                page.press("#message", "Enter")
                page.wait_for_function(  # the reply has streamed in and Send is back
                    f"document.querySelectorAll('.msg.assistant').length == {turn + 1}"
                    " && !document.getElementById('send').disabled",
                    timeout=20_000,
                )
                said.append({"role": "user", "content": question})
                reply = page.locator(".msg.assistant").nth(turn).text_content()
                assert reply == fresh_reply(engine, said, 12)
                said.append({"role": "assistant", "content": reply})
            assert page.locator(".msg.user").count() == 2
            # turn 2 resent turn 1: the server's KV cache held most of the prompt
            cached, prompt = re.search(
                r"\((\d+) of (\d+) prompt tokens", page.inner_text("#status")
            ).groups()
            assert int(prompt) > int(cached) > int(prompt) // 2
            page.click("#clear")
            assert page.locator(".msg").count() == 0
            assert outside == []
        finally:
            browser.close()
