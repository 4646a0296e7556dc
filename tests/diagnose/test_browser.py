"""End to end in headless Chromium at 1280 px: the report and the viewer, as a person sees them.

Checks what a reader would notice: no horizontal scrolling, no console errors, every chart with
labelled, round ticks on both axes, the metrics table scrolling inside its box; in the viewer the
prompt text in the list, tokens decoded with the store's own tokenizer and wrapped inside the pane,
supervised / excluded colouring, and links to the rollout's group siblings. Screenshots go to the
test's folder, and to ``docs/img/`` when ``GFCR_DOCS_SCREENSHOTS=1``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from diag_helpers import audit, group, rollout, showcase_store

from gfcr.store import RolloutStore

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
TEXT = "<b>bold?</b> Try 3*4=11. No: 3*4=12. Answer: 12"
WIDTH = 1280
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists() and shutil.which("chromium") is None,
                       reason="Debian chromium is not installed (run `make browser-deps`)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(store_path: Path):
    import uvicorn

    from gfcr.diagnose.viewer import create_app

    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(store_path), host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.time() + 20
    while not srv.started:
        assert time.time() < deadline, "viewer did not start"
        time.sleep(0.05)
    return srv, th, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def showcase(tmp_path_factory):
    from gfcr.testing import tiny_tokenizer

    d = tmp_path_factory.mktemp("showcase")
    tiny_tokenizer().save_pretrained(str(d / "tokenizer"))
    store = showcase_store(d / "store", str(d / "tokenizer"))
    srv, th, url = _serve(store.path)
    yield store, url, d
    srv.should_exit = True
    th.join(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    profile = tmp_path_factory.mktemp("profile")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=exe, headless=True, args=FLAGS,
                                                   viewport={"width": WIDTH, "height": 900})
        try:
            yield ctx
        finally:
            ctx.close()


def _watch(page) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("dialog", lambda d: errors.append("dialog opened: " + d.message))
    return errors


def _no_horizontal_overflow(page) -> None:
    sw, iw = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert sw <= iw, f"page is {sw} px wide in a {iw} px window"


def _shot(page, tmp: Path, name: str, **kw) -> Path:
    out = tmp / f"{name}.png"
    page.screenshot(path=str(out), **kw)
    assert out.stat().st_size > 10_000
    if os.environ.get("GFCR_DOCS_SCREENSHOTS") == "1" and name in ("report", "viewer"):
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, DOCS_IMG / f"{name}.png")
    return out


def _round(values: list[float]) -> bool:
    if len(values) < 2:
        return False
    step = values[1] - values[0]
    mant = step / 10 ** math.floor(math.log10(step))
    return (any(abs(mant - m) < 1e-6 for m in (1, 2, 2.5, 5))
            and all(abs(v / step - round(v / step)) < 1e-6 for v in values))


def test_report_in_chromium(showcase, browser, tmp_path):
    from gfcr.diagnose.report import write_report

    store, _, _ = showcase
    path = write_report(store, tmp_path / "report.html")
    page = browser.new_page()
    errors = _watch(page)
    page.goto(path.as_uri())
    charts = page.locator("svg.chart")
    assert charts.count() >= 10
    audited = sorted(set(store.get(store.audits().column("rollout_id").to_pylist(), columns=["step"]).column("step").to_pylist()))
    for i in range(charts.count()):
        c = charts.nth(i)
        title = c.get_attribute("aria-label")
        xt = [t.strip() for t in c.locator("text.xtick").all_text_contents()]
        yt = [t.strip() for t in c.locator("text.ytick").all_text_contents()]
        assert len(xt) >= 2 and all(xt) and len(yt) >= 3 and all(yt), title
        assert _round([float(v) for v in yt]), (title, yt)
        # ten steps: every one labelled; the ROSS chart spans the steps its judge audited (as `ross analyze`)
        want = audited if title.startswith("ROSS audits (arith-steps)") else list(range(10))
        assert xt == [str(s) for s in want], (title, xt)
        assert c.locator("text.axis-label").count() == 2, title
        # the chart and its title fit: nothing drawn outside the svg box
        box = c.bounding_box()
        for t in c.locator("text").all():
            tb = t.bounding_box()
            assert tb["x"] >= box["x"] - 1 and tb["x"] + tb["width"] <= box["x"] + box["width"] + 1, (title, t.text_content())
    assert page.locator("text.title", has_text="Long tail").count() == 1
    assert page.locator("text.title", has_text="Group control decisions").count() == 1
    assert page.locator("text.title", has_text="TER over steps").count() == 1
    assert page.locator('[data-detector="long_tail"]').count() == 1
    # the metrics table scrolls inside its box
    box = page.locator("#metrics-box")
    sw, cw = box.evaluate("(e) => [e.scrollWidth, e.clientWidth]")
    assert sw > cw and cw <= WIDTH
    _no_horizontal_overflow(page)
    full = _shot(page, tmp_path, "report-full", full_page=True)
    page.locator("#plots").scroll_into_view_if_needed()
    page.evaluate("() => window.scrollTo(0, document.getElementById('findings').offsetTop - 10)")
    _shot(page, tmp_path, "report")
    assert full.exists() and errors == []
    page.close()


def test_viewer_in_chromium(showcase, browser, tmp_path):
    from playwright.sync_api import expect

    store, url, _ = showcase
    page = browser.new_page()
    errors = _watch(page)
    page.goto(url)
    expect(page.locator("#rollouts tbody tr")).to_have_count(25)
    # prompt text, not a hash, in the list
    first = page.locator("#rollouts tbody tr td.prompt").first
    assert first.inner_text().startswith("Compute ")
    expect(page.locator("#tokenizer")).to_contain_text("the store's model")
    # open an audited rollout: decoded tokens, wrapped, coloured by supervision
    rid = store.audits().column("rollout_id").to_pylist()[0]
    page.goto(url + f"#rollout={rid}")
    page.wait_for_selector("#token-strip .tok-unsup")
    strip = page.locator("#token-strip")
    sw, cw = strip.evaluate("(e) => [e.scrollWidth, e.clientWidth]")
    assert sw <= cw + 1, "token strip runs past its pane"
    assert page.locator("#token-strip .tok-sup").count() > 10
    assert page.locator("#token-strip .tok-ctx").count() > 10
    pieces = page.locator("#token-strip .tok").all_text_contents()
    assert not all(p.strip().isdigit() for p in pieces[:20]), "tokens are ids, not decoded"
    assert "Compute" in "".join(pieces)
    excluded = page.locator("#assistant-turn pre .seg-excluded")
    assert excluded.count() == 1 and excluded.get_attribute("data-category") == "corrected_mistake"
    for col in (1, 2, 4, 5, 6, 7, 8):  # the list's short columns are whole beside an open rollout
        cut = page.locator(f"#rollouts tbody td:nth-child({col})").evaluate_all(
            "(cs) => cs.filter((c) => c.scrollWidth > c.clientWidth + 1).length")
        assert cut == 0, (col, cut)
    # siblings: the group's other samples, one click away
    sib = page.locator("#siblings a.sibling")
    assert sib.count() == 3
    other = sib.first.get_attribute("data-id")
    _no_horizontal_overflow(page)
    _shot(page, tmp_path, "viewer")
    sib.first.click()
    expect(page.locator("#detail-pane h2").first).to_have_text(f"Rollout {other}")
    assert page.url.endswith(f"#rollout={other}")
    _no_horizontal_overflow(page)
    assert errors == []
    page.close()


def test_viewer_shows_the_ross_judge_not_the_control(browser, tmp_path):
    """Issue 45: with the ROSS judge's and the keep-all control's audits of the same rollouts (a
    tie), the viewer draws arith-steps' exclusions and names it; ``?judge=keep-all`` shows the control."""
    from playwright.sync_api import expect

    from gfcr.records import Audit
    from gfcr.testing import tiny_tokenizer

    tiny_tokenizer().save_pretrained(str(tmp_path / "tokenizer"))
    store = showcase_store(tmp_path / "store", str(tmp_path / "tokenizer"), steps=4)
    judged = store.audits(judge="arith-steps").to_pylist()
    roles = dict(zip(*store.get([a["rollout_id"] for a in judged], columns=["rollout_id", "token_role"]).to_pydict().values(),
                     strict=True))
    store.upsert_audits([Audit(rollout_id=a["rollout_id"], judge="keep-all", judge_version="1", status="kept",
                               mask=(np.asarray(roles[a["rollout_id"]]) == 1).astype(np.uint8), excluded=[], ter=0.0)
                         for a in judged])
    rid = judged[0]["rollout_id"]
    srv, th, url = _serve(store.path)
    try:
        page = browser.new_page()
        errors = _watch(page)
        page.goto(url + f"#rollout={rid}")
        expect(page.locator("#audit-label")).to_contain_text("audit arith-steps@1: kept")
        expect(page.locator("#f-judge")).to_have_value("arith-steps")
        expect(page.locator("#ross-ter")).to_contain_text("ROSS judge arith-steps")
        excluded = page.locator("#assistant-turn pre .seg-excluded")
        assert excluded.count() == 1 and excluded.get_attribute("data-category") == "corrected_mistake"
        assert page.locator("#token-strip .tok-unsup").count() == int(
            (np.asarray(roles[rid]) == 1).sum() - np.asarray(judged[0]["mask"]).sum())
        page.select_option("#f-judge", "keep-all")
        expect(page.locator("#audit-label")).to_contain_text("audit keep-all@1: kept")
        assert "judge=keep-all" in page.url
        page.goto(url + f"?judge=keep-all#rollout={rid}")
        expect(page.locator("#audit-label")).to_contain_text("audit keep-all@1")
        expect(page.locator("#f-judge")).to_have_value("keep-all")
        assert page.locator("#assistant-turn pre .seg-excluded").count() == 0
        assert page.locator("#token-strip .tok-unsup").count() == 0
        assert errors == []
        page.close()
    finally:
        srv.should_exit = True
        th.join(timeout=10)


def test_viewer_search_sort_page_size_and_filters_in_the_url(browser, tmp_path):
    """Issue 45, part 2: text search, a header click sorts (twice reverses), every filter in the URL (a
    reload opens the same list), page size."""
    from playwright.sync_api import expect

    store = RolloutStore.open(tmp_path / "store", create=True)
    rows = [rollout("run-a", i % 4, f"p{i}", reward=round(i / 40, 3), gen_len=6 + i % 7, verified=i % 2 == 0,
                    text="a zebra, then the sum" if i % 10 == 3 else f"the sum is {i}", rollout_id=f"r{i:02d}")
            for i in range(40)]
    store.append(rows)
    srv, th, url = _serve(store.path)
    try:
        page = browser.new_page()
        errors = _watch(page)
        page.goto(url)
        expect(page.locator("#rollouts tbody tr")).to_have_count(25)
        page.fill("#f-q", "ZEBRA")
        page.click("#f-apply")
        expect(page.locator("#page-info")).to_have_text("1–4 of 4")
        assert "q=ZEBRA" in page.url
        expect(page.locator("#search-note")).to_contain_text("no text index")  # this store has none: said
        page.click("#rollouts th[data-sort='reward']")  # the first click on reward sorts high to low
        expect(page.locator("#rollouts tbody tr").first).to_have_attribute("data-id", "r33")
        assert "sort=reward" in page.url and "order=desc" in page.url
        page.click("#rollouts th[data-sort='reward']")
        expect(page.locator("#rollouts tbody tr").first).to_have_attribute("data-id", "r03")
        ids = page.locator("#rollouts tbody tr").evaluate_all("(rs) => rs.map((r) => r.dataset.id)")
        assert ids == ["r03", "r13", "r23", "r33"]
        page.goto(page.url)  # a shared link / reload: the same filters, order and rows
        expect(page.locator("#page-info")).to_have_text("1–4 of 4")
        assert page.locator("#f-q").input_value() == "ZEBRA" and page.locator("#f-sort").input_value() == "reward"
        assert page.locator("#rollouts tbody tr").evaluate_all("(rs) => rs.map((r) => r.dataset.id)") == ids
        expect(page.locator("#rollouts th[data-sort='reward']")).to_have_attribute("data-on", "asc")
        page.fill("#f-q", "")
        page.fill("#f-gen-min", "12")
        page.click("#f-apply")
        expect(page.locator("#page-info")).to_have_text("1–5 of 5")  # gen_len 12 on i % 7 == 6
        page.fill("#f-gen-min", "")
        page.click("#f-apply")
        page.select_option("#f-limit", "50")
        expect(page.locator("#rollouts tbody tr")).to_have_count(40)
        assert "limit=50" in page.url
        _no_horizontal_overflow(page)
        assert errors == []
        page.close()
    finally:
        srv.should_exit = True
        th.join(timeout=10)


@pytest.fixture()
def small_server(tmp_path):
    store = RolloutStore.open(tmp_path / "store", create=True)
    rows = group("run-a", 0, "p1", [1.0, 0.0], [True, False]) + group("run-b", 0, "p1", [0.0, 0.0], [False, False])
    target = rollout("run-a", 1, "p2", 1.0, verified=True, text=TEXT, gen_len=12, rollout_id="target-rollout")
    rows.append(target)
    store.append(rows)
    a, b = TEXT.index("Try"), TEXT.index("No:")
    store.upsert_audits([audit(target, [(a, b, "corrected_mistake")], ter=0.25)])
    srv, th, url = _serve(store.path)
    yield url
    srv.should_exit = True
    th.join(timeout=10)


def test_viewer_filters_and_escapes(small_server, browser):
    from playwright.sync_api import expect

    page = browser.new_page()
    errors = _watch(page)
    page.goto(small_server)
    expect(page.locator("#rollouts tbody tr")).to_have_count(5)
    # a store that records no model says so, and shows ids
    expect(page.locator("#tokenizer")).to_contain_text("records no model")
    page.select_option("#f-run", "run-a")
    page.select_option("#f-verified", "true")
    page.click("#f-apply")
    # no wait_for_function: the page's CSP forbids string evaluation, which it needs
    expect(page.locator("#page-info")).to_have_text("1–2 of 2")
    expect(page.locator("#rollouts tbody tr")).to_have_count(2)
    page.click("#rollouts tbody tr[data-id='target-rollout']")
    page.wait_for_selector("#assistant-turn .seg-excluded")
    excluded = page.locator("#assistant-turn pre .seg-excluded")
    assert excluded.count() == 1 and excluded.inner_text() == "Try 3*4=11. "
    assert "cat-corrected_mistake" in (excluded.get_attribute("class") or "")
    sup = page.locator("#assistant-turn pre .seg-supervised")
    assert [sup.nth(i).inner_text() for i in range(sup.count())] == ["<b>bold?</b> ", "No: 3*4=12. Answer: 12"]
    assert page.locator("#assistant-turn b").count() == 0  # model text is never parsed as HTML
    assert page.locator(".tokens .tok-ctx").count() == 4 and page.locator(".tokens .tok-gen").count() == 12
    assert re.fullmatch(r"\d+", page.locator(".tokens .tok-gen").first.inner_text())
    assert '"exact"' in page.inner_text("#verifier")
    assert errors == []
    page.close()


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from gfcr.testing import tiny_tokenizer

    d = tmp_path_factory.mktemp("two-runs")
    tiny_tokenizer().save_pretrained(str(d / "tokenizer"))
    showcase_store(d / "store", str(d / "tokenizer"))
    store = showcase_store(d / "store", str(d / "tokenizer"), run_id="grpo-sums-b", seed=11)
    srv, th, url = _serve(store.path)
    yield store, url
    srv.should_exit = True
    th.join(timeout=10)


def _overlay_shot(page, tmp: Path, name: str) -> None:
    out = _shot(page, tmp, name)
    if os.environ.get("GFCR_DOCS_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, DOCS_IMG / f"{name}.png")


def test_viewer_overlays_slider_and_two_runs(two_runs, browser, tmp_path):
    """Issue 27 item 3: each overlay colours the token strip from the stored per-token values (the
    ROSS mask with each excluded token's category), the step slider lists one step, and two runs
    show side by side; no console errors, no overflow at 1280 px."""
    from playwright.sync_api import expect

    store, url = two_runs
    page = browser.new_page()
    errors = _watch(page)
    page.goto(url)
    expect(page.locator("#rollouts tbody tr")).to_have_count(25)
    # the step slider: one run, step 4 only
    page.select_option("#f-run", "grpo-sums")
    page.locator("#f-step").fill("4")
    expect(page.locator("#f-step-value")).to_have_text("step 4")
    n4 = store.count(where="run_id = 'grpo-sums' AND step = 4")
    expect(page.locator("#page-info")).to_have_text(f"1–{min(25, n4)} of {n4}")
    steps = page.locator("#rollouts tbody tr td:nth-child(2)").all_text_contents()
    assert set(steps) == {"4"}
    # an audited rollout, compared with the other run at the same step
    a = store.sql("SELECT a.rollout_id, r.step, r.prompt_id FROM audits a JOIN rollouts r USING (rollout_id) "
                  "WHERE r.run_id = 'grpo-sums' ORDER BY r.step LIMIT 1").to_pylist()[0]
    page.select_option("#f-run-b", "grpo-sums-b")
    assert "compare=grpo-sums-b" in page.url  # the compared run is in the URL with the filters
    expect(page.locator("#paired-summary")).to_contain_text("share no prompt with a verdict")  # said, not an error
    page.goto(page.url.split("#")[0] + f"#rollout={a['rollout_id']}")  # same page, filters kept
    page.wait_for_selector("#detail-pane.compare [data-side=b] #token-strip")
    left, right = page.locator("[data-side=a]"), page.locator("[data-side=b]")
    expect(left.locator("h2").first).to_have_text(f"Rollout {a['rollout_id']}")
    assert f"run grpo-sums-b · step {a['step']}" in right.locator(".muted").first.inner_text()
    for side in (left, right):
        strip = side.locator("#token-strip")
        sw, cw = strip.evaluate("(e) => [e.scrollWidth, e.clientWidth]")
        assert sw <= cw + 1, "token strip runs past its column"
    # issue 45: with the compare pane open the list keeps the page's width (it shrank to ~260 px),
    # above the two columns, and no run, step, reward or finish cell is cut
    lw = page.locator("#list-pane").evaluate("(e) => e.getBoundingClientRect().width")
    assert lw > 0.9 * WIDTH, lw
    for col in (1, 2, 5, 7):
        cut = page.locator(f"#rollouts tbody td:nth-child({col})").evaluate_all(
            "(cs) => cs.filter((c) => c.scrollWidth > c.clientWidth + 1).length")
        assert cut == 0, (col, cut)
    _no_horizontal_overflow(page)
    _overlay_shot(page, tmp_path, "viewer-compare")
    d = store.get([a["rollout_id"]]).to_pylist()[0]
    n_gen = sum(d["token_role"])
    # each numeric overlay: every generated token shaded, the value in its tooltip
    for name in ("logprob", "entropy", "gap", "advantage"):
        left.locator(f"button.ov-btn[data-overlay={name}]").click()
        shaded = left.locator("#token-strip .ov-v")
        expect(shaded).to_have_count(n_gen)
        assert name in (shaded.first.get_attribute("title") or "")
        assert left.locator(f".legend[data-overlay={name}]").count() == 1
    # logprob tooltips carry the stored values
    left.locator("button.ov-btn[data-overlay=logprob]").click()
    first_gen = d["token_role"].index(1)
    tip = left.locator(f"#token-strip span[data-i='{first_gen}']").get_attribute("title")
    assert f"logprob {d['logprobs'][first_gen]:.3f}" in tip
    # loss mask, then the ROSS mask with the excluded span's category on its tokens
    left.locator("button.ov-btn[data-overlay=loss_mask]").click()
    expect(left.locator("#token-strip .ov-in")).to_have_count(n_gen)
    left.locator("button.ov-btn[data-overlay=ross_mask]").click()
    excl = left.locator("#token-strip .ov-excl")
    (au,) = [x for x in store.audits(rollout_ids=[a["rollout_id"]]).to_pylist()]
    n_out = sum(1 for m, r in zip(au["mask"], d["token_role"], strict=True) if r == 1 and m == 0)
    assert n_out > 0 and excl.count() == n_out
    assert left.locator("#token-strip .cat-corrected_mistake").count() >= n_out - 1
    assert "excluded: corrected_mistake" in (left.locator("#token-strip .cat-corrected_mistake").first.get_attribute("title") or "")
    _no_horizontal_overflow(page)
    _overlay_shot(page, tmp_path, "viewer-overlays")
    assert errors == []
    page.close()


def test_viewer_compare_table_pairs_two_runs_per_prompt(browser, tmp_path):
    """Issue 45, part 3: with a run and a compared run chosen, the two paired per prompt; a click on a
    prompt where they differ lists it."""
    from playwright.sync_api import expect
    from test_viewer_paired import VERDICTS

    store = RolloutStore.open(tmp_path / "store", create=True)
    store.append([rollout(run, 0, p, reward=float(v), verified=bool(v), rollout_id=f"{run}-{p}-{i}")
                  for run, per in VERDICTS.items() for p, vs in per.items() for i, v in enumerate(vs)])
    srv, th, url = _serve(store.path)
    try:
        page = browser.new_page()
        errors = _watch(page)
        page.goto(url + "?run=run-a&compare=run-b")
        expect(page.locator("#paired-summary")).to_contain_text("run-a − run-b, verified rate per prompt: +0.000")
        expect(page.locator("#paired-summary")).to_contain_text("over 3 prompts")
        expect(page.locator("#paired-table tbody tr")).to_have_count(2)  # the prompts where they differ
        page.click("#paired-table button[data-prompt='p3']")
        expect(page.locator("#page-info")).to_have_text("1–2 of 2")  # run-a's two rollouts of p3
        assert page.locator("#f-prompt").input_value() == "p3" and "prompt=p3" in page.url
        page.select_option("#f-run-b", "")
        expect(page.locator("#paired")).to_be_hidden()
        assert errors == []
        page.close()
    finally:
        srv.should_exit = True
        th.join(timeout=10)


def test_viewer_indexed_search_and_a_histogram_bar_filters(browser, tmp_path):
    """Issue 45: the search through the store's text index (no "row by row" note; rows appended after
    the index still found), and a click on a histogram bar sets that range's filter, in the URL, and
    lists exactly the bar's rollouts."""
    from playwright.sync_api import expect

    store = RolloutStore.open(tmp_path / "store", create=True)
    rows = [rollout("run-a", i % 4, f"p{i}", reward=round((i % 8) / 8, 3), gen_len=6 + i % 5, verified=i % 2 == 0,
                    text="a zebra, then the sum" if i % 10 == 3 else f"the sum is {i}", rollout_id=f"r{i:02d}")
            for i in range(40)]
    store.append(rows[:30])
    store.index_text()
    store.append(rows[30:])  # r33: after the index
    srv, th, url = _serve(store.path)
    try:
        page = browser.new_page()
        errors = _watch(page)
        page.goto(url + "?q=ZEBRA")
        expect(page.locator("#page-info")).to_have_text("1–4 of 4")
        ids = page.locator("#rollouts tbody tr").evaluate_all("(rs) => rs.map((r) => r.dataset.id)")
        assert ids == ["r13", "r33", "r23", "r03"]  # run, step, prompt order
        expect(page.locator("#search-note")).to_be_hidden()
        page.fill("#f-q", "")
        page.click("#f-apply")
        bars = page.locator("#hist-reward rect.bar:not(.empty)")
        expect(bars).to_have_count(8)  # rewards 0, 1/8, ..., 7/8: one bar each
        bar = bars.nth(2)
        n = int(bar.get_attribute("data-count"))
        bar.click()
        expect(page.locator("#page-info")).to_have_text(f"1–{n} of {n}")
        assert "reward_min=0.25" in page.url and "reward_max=0.25" in page.url
        expect(page.locator("#hist-reward rect.bar.on")).to_have_count(1)
        expect(page.locator("#hist-gen figcaption")).to_contain_text(f"of the {n} listed rollouts")  # redrawn
        gbar = page.locator("#hist-gen rect.bar:not(.empty)").last  # gen tokens 10 (i % 5 == 4), among reward 0.25
        m = int(gbar.get_attribute("data-count"))
        assert m == 1  # i = 34 (i % 8 == 2 and i % 5 == 4)
        gbar.click()
        expect(page.locator("#page-info")).to_have_text(f"1–{m} of {m}" if m else "no rollouts match")
        assert "gen_min=" in page.url and page.locator("#f-gen-min").input_value() == page.locator("#f-gen-max").input_value()
        page.goto(page.url)  # the bar's filters survive a reload
        expect(page.locator("#page-info")).to_have_text(f"1–{m} of {m}")
        page.locator("#hist-gen rect.bar.on").click()  # the chosen bar again: its filter is cleared
        expect(page.locator("#page-info")).to_have_text(f"1–{n} of {n}")
        assert page.locator("#f-gen-min").input_value() == "" and "gen_min" not in page.url
        _no_horizontal_overflow(page)
        assert errors == []
        page.close()
    finally:
        srv.should_exit = True
        th.join(timeout=10)


def test_viewer_lineage_from_a_rollout(browser, tmp_path):
    """Issue 45: from a rollout's detail, the link to what trained the checkpoint after its step (fresh
    and replayed), and from there a click opens one of those rollouts."""
    from playwright.sync_api import expect

    from gfcr.testing import make_rollout

    store = RolloutStore.open(tmp_path / "store", create=True)
    store.append([make_rollout(0, step=0, rollout_id="a", meta={"trained": True, "replayed_at_step": [1]}),
                  make_rollout(1, step=0, rollout_id="b", meta={"trained": False}),
                  make_rollout(2, step=1, rollout_id="c", meta={"trained": True})])
    srv, th, url = _serve(store.path)
    try:
        page = browser.new_page()
        errors = _watch(page)
        page.goto(url + "#rollout=c")
        page.click("#detail-pane a.lineage-link")
        expect(page.locator("#lineage-summary")).to_have_text(
            "2 rollouts: 2 fresh uses and 1 replayed uses over 2 training steps")
        assert page.locator("#lineage-rollouts tbody tr").evaluate_all("(rs) => rs.map((r) => r.dataset.id)") == ["a", "c"]
        expect(page.locator("#lineage-rollouts tbody tr").first.locator("td").nth(3)).to_have_text("fresh + replayed")
        assert "#lineage=run-a@1" in page.url
        page.click("#lineage-steps a >> text='0'")  # the checkpoint after step 0
        expect(page.locator("#lineage-summary")).to_have_text("1 rollouts: 1 fresh uses and 0 replayed uses over 1 training steps")
        page.click("a.lineage-rollout[data-id='a']")
        expect(page.locator("#detail-pane h2").first).to_have_text("Rollout a")
        page.goto(url + "?run=run-a")  # from the filter bar: a chosen run's last checkpoint
        expect(page.locator("#run-lineage")).to_have_text("what trained run-a's checkpoint after step 1")
        page.click("#run-lineage")
        expect(page.locator("#lineage-summary")).to_contain_text("2 rollouts: 2 fresh uses and 1 replayed uses")
        assert errors == []
        page.close()
    finally:
        srv.should_exit = True
        th.join(timeout=10)
