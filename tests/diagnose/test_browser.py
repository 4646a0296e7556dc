"""End to end in headless Chromium: open the viewer, filter, open a rollout, check the spans."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from diag_helpers import audit, group, rollout

from gfcr.store import RolloutStore

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
TEXT = "<b>bold?</b> Try 3*4=11. No: 3*4=12. Answer: 12"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists() and shutil.which("chromium") is None,
                       reason="Debian chromium is not installed (run `make browser-deps`)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def server(tmp_path):
    import uvicorn

    from gfcr.diagnose.viewer import create_app

    store = RolloutStore.open(tmp_path / "store", create=True)
    rows = group("run-a", 0, "p1", [1.0, 0.0], [True, False]) + group("run-b", 0, "p1", [0.0, 0.0], [False, False])
    target = rollout("run-a", 1, "p2", 1.0, verified=True, text=TEXT, gen_len=12, rollout_id="target-rollout")
    rows.append(target)
    store.append(rows)
    a, b = TEXT.index("Try"), TEXT.index("No:")
    store.upsert_audits([audit(target, [(a, b, "corrected_mistake")], ter=0.25)])
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(store.path), host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline, "viewer did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/"
    srv.should_exit = True
    th.join(timeout=10)


def test_viewer_in_chromium(server, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    profile = tmp_path / "profile"
    profile.mkdir()
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=exe, headless=True, args=FLAGS,
                                                   viewport={"width": 1400, "height": 900})
        try:
            page = ctx.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda d: errors.append("dialog opened: " + d.message))
            page.goto(server)
            expect(page.locator("#rollouts tbody tr")).to_have_count(5)
            # filter: run-a, verified only
            page.select_option("#f-run", "run-a")
            page.select_option("#f-verified", "true")
            page.click("#f-apply")
            # no wait_for_function: the page's CSP forbids string evaluation, which it needs
            expect(page.locator("#page-info")).to_have_text("1–2 of 2")
            expect(page.locator("#rollouts tbody tr")).to_have_count(2)
            # open the audited rollout
            page.click("#rollouts tbody tr[data-id='target-rollout']")
            page.wait_for_selector("#assistant-turn .seg-excluded")
            excluded = page.locator("#assistant-turn pre .seg-excluded")
            assert excluded.count() == 1
            assert excluded.get_attribute("data-category") == "corrected_mistake"
            assert excluded.inner_text() == "Try 3*4=11. "
            assert "cat-corrected_mistake" in (excluded.get_attribute("class") or "")
            sup = page.locator("#assistant-turn pre .seg-supervised")
            assert [sup.nth(i).inner_text() for i in range(sup.count())] == ["<b>bold?</b> ", "No: 3*4=12. Answer: 12"]
            assert page.locator("#assistant-turn b").count() == 0  # model text is never parsed as HTML
            assert page.locator(".tokens .tok-ctx").count() == 4 and page.locator(".tokens .tok-gen").count() == 12
            assert '"exact"' in page.inner_text("#verifier")
            shot = tmp_path / "viewer.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            assert errors == []
        finally:
            ctx.close()
