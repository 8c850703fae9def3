"""The playground in a real browser: Debian's Chromium driven by Python playwright, on a desktop
(1400x1000), a laptop (1366x768) and a phone (390x844, touch) viewport.

What a first-time visitor meets: the scope text; an example in slow motion (>= 2 s) with the live
tau slider moved mid-run; the step-through replay; a queue position for a second page while the
first runs (with Gradio's estimate), and Stop cancelling the queued job; the first output token in
view on the phone, and on the laptop with the tau slider still on screen; markup typed into every
text field staying text; a minimal Under load run with its figures and summary; WCAG 2 A/AA as
axe-core (vendored) checks it, on every tab. Screenshots go to test-artifacts/.
"""
from __future__ import annotations

import os
import re
import time

import pytest

from browser_fixtures import (  # noqa: F401 - the fixtures are used by name
    ARTIFACTS, DESKTOP, LAPTOP, PHONE, XSS, XSS_AR, axe_violations, browser, example, fill_field, needs_chromium, one_slot_url, open_page, open_tab, pair, serve, set_slider, settings, short_url, status_of, steps_of, sync_api, url, wait_finished)

pytestmark = needs_chromium


@pytest.mark.parametrize("device", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_scope_text_is_there_before_anything_runs(browser, url, device):
    t0 = time.perf_counter()
    page = open_page(browser, url, device)
    page.wait_for_selector("#scope-text", state="visible")
    print(f"page explains itself after {time.perf_counter() - t0:.2f} s")  # reported, not asserted
    text = page.locator("#scope-text").inner_text()
    assert "About this model" in text and "fixture-mars" in text and "parameters" in text
    box = page.locator("#scope-text").bounding_box()
    assert box["y"] < page.locator("#prompt").bounding_box()["y"]  # above the prompt
    assert page.locator("#stop").is_disabled()  # nothing runs: Stop is off
    page.context.close()


def test_slow_motion_live_tau_and_replay(browser, url):
    page = open_page(browser, url)
    example(page)
    settings(page, tau=1, slow=50, max_new=60, ar_side="MARS model at 1 token/step")
    t0 = time.perf_counter()
    page.locator("#generate").click()
    page.wait_for_function("document.querySelectorAll('#mars-panel span.tok').length >= 10", timeout=60_000)
    assert page.locator("#stop").is_enabled() and status_of(page, "mars") == "running"
    set_slider(page, "tau", 0)  # mid-run
    page.wait_for_selector("#mars-panel span.tok[data-n='4']", timeout=60_000)
    assert status_of(page, "ar") == "running"  # the change is visible while the run goes on
    page.screenshot(path=os.path.join(ARTIFACTS, "slow-motion-running.png"), full_page=True)
    wait_finished(page)
    took = time.perf_counter() - t0
    assert took >= 2.0, f"slow motion: a held-out example took {took:.2f} s"
    steps = steps_of(page, "mars")
    assert sum(steps) == 60 and steps[:10] == [1] * 10 and max(steps) == 4
    speed = page.locator("#speed").inner_text()
    assert page.locator("#mars-panel .cnt[data-k=tps] b").inner_text() in speed
    assert page.locator("#stop").is_disabled()
    # the replay: pick a forward, see its B predictions with their marks
    page.locator("#replay-step input[type=number]").fill("3")
    page.locator("#replay-step input[type=number]").press("Enter")
    page.wait_for_selector("#replay .replay[data-step='3']", timeout=10_000)
    rows = page.locator("#replay tr.pred")
    assert rows.count() == 4
    marks = [rows.nth(i).get_attribute("data-mark") for i in range(4)]
    assert marks[0] == "accepted" and "rejected" in marks  # tau was 1 at forward 3: one taken, three not
    page.locator("#replay-next").click()
    page.wait_for_selector("#replay .replay[data-step='4']", timeout=10_000)
    page.locator("#replay").scroll_into_view_if_needed()
    page.screenshot(path=os.path.join(ARTIFACTS, "replay.png"), full_page=True)
    page.context.close()


def test_queue_position_for_a_second_page_and_stop_cancels_it(browser, one_slot_url):
    first, second = open_page(browser, one_slot_url), open_page(browser, one_slot_url)
    # Gradio estimates a wait from the jobs of that endpoint that finished: one short run first
    example(first)
    settings(first, slow=0, max_new=8)
    first.locator("#generate").click()
    wait_finished(first)
    for page in (first, second):
        example(page)
        settings(page, tau=1, slow=100, max_new=60)
    first.locator("#generate").click()
    first.wait_for_selector("#mars-panel span.tok", timeout=60_000)
    second.locator("#generate").click()
    second.wait_for_function("document.querySelector('#run-status').innerText.includes('queue')", timeout=30_000)
    shown = second.locator("#run-status").inner_text()
    # the position, then Gradio's elapsed/estimated seconds, e.g. "queue: 1/1 | 0.4/5.7s"
    assert re.search(r"queue: 1/1\s*\|\s*\d+(\.\d+)?/\d+(\.\d+)?s", shown), shown
    second.screenshot(path=os.path.join(ARTIFACTS, "queued.png"))
    assert second.locator("#stop").is_enabled()
    second.locator("#stop").click()
    second.wait_for_function("document.querySelector('#run-status').innerText.includes('Cancelled')",
                             timeout=30_000)
    assert second.locator("#stop").is_disabled()
    first.locator("#stop").click()  # ends the first run too
    wait_finished(first)
    second.wait_for_timeout(1500)
    assert status_of(second, "mars") == "idle" and second.locator("#mars-panel span.tok").count() == 0
    first.context.close()
    second.context.close()


def assert_in_view(page, selector: str) -> None:
    box = page.locator(selector).first.bounding_box()  # relative to the viewport
    height = page.viewport_size["height"]
    assert 0 <= box["y"] and box["y"] + box["height"] <= height, (selector, box, height)


def generate_and_see(page, token_selector: str, tap: bool = False) -> None:
    """Run the first example (40 tokens) and check that its first token is on screen."""
    example(page)
    settings(page, max_new=40)
    if tap:
        page.locator("#generate").tap()
    else:
        page.locator("#generate").click()
    page.wait_for_selector(token_selector, timeout=60_000)
    page.wait_for_timeout(300)
    assert_in_view(page, token_selector)


def test_phone_shows_the_first_token_after_generate(browser, url):
    page = open_page(browser, url, PHONE)
    box = page.locator("#generate").bounding_box()
    assert box["y"] + box["height"] <= 1.5 * PHONE["viewport"]["height"], box  # within a screen and a half
    generate_and_see(page, "#ar-panel span.tok", tap=True)
    page.screenshot(path=os.path.join(ARTIFACTS, "phone-running.png"))
    assert_in_view(page, "#tau input[type=range]")  # while it plays, the live tau rides at the bottom
    assert_in_view(page, "#stop")  # and Stop floats above it
    wait_finished(page)
    fixed = "getComputedStyle(document.querySelector('#tau input[type=range]').closest('.wrap')).position"
    assert page.evaluate(fixed) != "fixed"  # and goes back to its place
    width = page.locator("#mars-panel").bounding_box()["width"]
    assert width > 300  # stacked, full width
    i = page.evaluate("[...document.querySelectorAll('#mars-panel span.tok')]"
                      ".findIndex(e => e.getClientRects().length === 1 && e.getBoundingClientRect().width > 6)")
    tok = page.locator("#mars-panel span.tok").nth(i)
    tok.scroll_into_view_if_needed()
    box = tok.bounding_box()
    page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # token details on tap
    assert page.evaluate("document.activeElement.dataset.tip").startswith("forward ")
    page.screenshot(path=os.path.join(ARTIFACTS, "phone-done.png"), full_page=True)
    page.context.close()


def test_desktop_shows_the_first_token_and_keeps_the_tau_slider_in_view(browser, url):
    page = open_page(browser, url, LAPTOP)  # the 1000-px desktop shows the fixture's panels anyway
    assert_in_view(page, "#generate")  # above the fold of a 1366x768 laptop
    generate_and_see(page, "#mars-panel span.tok")
    assert_in_view(page, "#tau input[type=range]")  # live tau still usable
    wait_finished(page)
    page.context.close()


def test_enter_submits_and_shift_enter_adds_a_line(browser, url):
    page = open_page(browser, url)
    settings(page, max_new=8, slow=0)
    box = page.locator("#prompt textarea")
    box.fill("What is 24 * 3?")
    box.press("Shift+Enter")
    assert box.input_value().endswith("\n") and status_of(page, "mars") == "idle"
    box.press("Enter")
    wait_finished(page)
    assert page.locator("#mars-panel span.tok").count() > 0
    page.context.close()


def test_markup_in_every_text_field_stays_text(browser, url):
    page = open_page(browser, url)
    page.locator("#prompt textarea").fill(XSS + " What is 24 * 3?")  # the prompt: decoded, never echoed
    settings(page, max_new=8, slow=0)
    page.locator("#generate").click()
    wait_finished(page)
    page.get_by_role("tab", name="Frontier").click()
    fill_field(page.get_by_label("taus"), XSS, default="1.0, 0.9, 0.7, 0.5")
    page.locator("#frontier-run").click()
    error = page.locator("#frontier-status .run-status[data-kind=error]")
    error.wait_for(timeout=90_000)  # a loaded 2-core machine can take long to answer
    assert "<img" in error.inner_text()  # shown as text, in place
    page.get_by_role("tab", name="Models").click()
    page.get_by_role("radio", name="custom").check()
    fill_field(page.locator("#mars-source input"), XSS, default="")  # "custom" empties it
    page.locator("#mars-source input").press("Enter")
    page.locator("#load-models").click()
    sync_api.expect(page.locator("#load-result")).to_contain_text("unknown model", timeout=90_000)
    # the AR dropdown takes a custom value too: a listed MARS model, markup as the AR baseline
    page.locator("#mars-source input").fill("fixture-mars")
    page.locator("#mars-source input").press("Enter")
    fill_field(page.locator("#ar-source input"), XSS_AR, default="")  # optional: empty until set
    page.locator("#ar-source input").press("Enter")
    sync_api.expect(page.locator("#ar-source input")).to_have_value(XSS_AR)  # Enter kept it
    page.locator("#load-models").click()
    sync_api.expect(page.locator("#load-result")).to_contain_text("<img src=y", timeout=90_000)
    assert "unknown model" in page.locator("#load-result").inner_text()  # the AR name read, refused, as text
    assert page.evaluate("window.__xss") is None
    assert page.locator("img[src='x']").count() == 0 and page.locator("img[src='y']").count() == 0
    page.screenshot(path=os.path.join(ARTIFACTS, "markup-as-text.png"), full_page=True)
    assert "Loaded" not in page.locator("#load-result").inner_text()  # a refused load claims nothing
    page.get_by_role("radio", name="bundled").check()
    page.locator("#load-models").click()  # the answer appears in the tab, next to the button
    sync_api.expect(page.locator("#load-result")).to_contain_text("Loaded for your session", timeout=30_000)
    assert "fixture-mars" in page.locator("#load-result").inner_text()
    page.context.close()


def duplicate_ids(page) -> list:
    """Element ids used more than once (axe no longer checks it under WCAG 2.1; a label or a
    script that targets the id finds the wrong element)."""
    return page.evaluate("() => { const c = {}; document.querySelectorAll('[id]').forEach(e => "
                         "{ if (e.id) c[e.id] = (c[e.id] || 0) + 1; }); return Object.keys(c).filter(k => c[k] > 1); }")


@pytest.mark.parametrize("device", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_wcag_aa_on_load_and_after_a_generation(browser, url, device):
    page = open_page(browser, url, device)
    assert axe_violations(page) == []
    assert duplicate_ids(page) == []
    example(page, 2)
    settings(page, tau=0.5, max_new=30, slow=0)
    page.locator("#generate").click()
    wait_finished(page)
    page.wait_for_timeout(300)
    assert axe_violations(page) == []  # panels, coloured tokens, speed bars, replay table
    page.context.close()


@pytest.mark.parametrize("device", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_other_tabs(browser, url, device):
    tag = "phone" if device is PHONE else "desktop"
    page = open_page(browser, url, device)
    open_tab(page, "Frontier")
    page.wait_for_selector("#frontier-plot .js-plotly-plot", timeout=30_000)
    assert "Precomputed sweep" in page.locator("#frontier-note").inner_text()
    assert one_line_cells(page, "#frontier-note")
    page.screenshot(path=os.path.join(ARTIFACTS, f"frontier-{tag}.png"), full_page=True)
    open_tab(page, "Batch & KV cache")
    page.wait_for_selector("#batch-plot .js-plotly-plot", timeout=30_000)
    assert axe_violations(page) == []  # the other tabs too (on the page as shown)
    page.locator("#batch-run").click()
    page.wait_for_selector("#batch-plot .js-plotly-plot .heatmaplayer", timeout=90_000)
    assert "Speed-up of MARS over AR" in page.locator("#batch-summary").inner_text()
    assert one_line_cells(page, "#batch-summary")  # a phone scrolls the table sideways, whole words
    assert axe_violations(page) == []  # the scrolled table is focusable
    page.screenshot(path=os.path.join(ARTIFACTS, f"batch-{tag}.png"), full_page=True)
    open_tab(page, "How it works")
    page.wait_for_selector("#mask-plot .js-plotly-plot", timeout=30_000)
    page.screenshot(path=os.path.join(ARTIFACTS, f"how-it-works-{tag}.png"), full_page=True)
    page.context.close()


def one_line_cells(page, where: str) -> bool:
    """Every cell of the result table in `where` holds its text on one line (no column squeezed
    to a letter per line, as on a phone before)."""
    heights = page.eval_on_selector_all(f"{where} table :is(th, td)", "cells => cells.map(c => "
                                        "c.getBoundingClientRect().height / parseFloat(getComputedStyle(c).lineHeight))")
    return bool(heights) and max(heights) < 2.6  # one line plus padding


@pytest.mark.parametrize("device", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_wcag_aa_on_the_frontier_models_and_how_tabs(browser, url, device):
    page = open_page(browser, url, device)
    for tab, ready in (("Frontier", "#frontier-plot .js-plotly-plot"), ("Models", "#load-models"),
                       ("How it works", "#mask-plot .js-plotly-plot")):
        open_tab(page, tab)
        page.wait_for_selector(ready, timeout=30_000)
        page.wait_for_timeout(300)
        assert axe_violations(page) == [], tab
    page.locator("#window-show").click()  # the sliding-window plot of (no) last generation
    page.wait_for_selector("#window-plot .js-plotly-plot", timeout=30_000)
    assert axe_violations(page) == []
    page.context.close()


@pytest.mark.parametrize("device", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_under_load_tab_runs_a_short_simulation(browser, short_url, device):
    page = open_page(browser, short_url, device)
    open_tab(page, "Under load")
    page.wait_for_selector("#load-run", timeout=30_000)
    for plot in ("#load-timeline", "#load-front"):  # the placeholder figures draw once plotly has loaded
        try:
            page.wait_for_selector(f"{plot} .js-plotly-plot", timeout=15_000)
        except sync_api.TimeoutError:
            pass  # no figure at all: axe says what that leaves on the page
    assert axe_violations(page) == []  # before a run: the placeholders, the controls
    # the smallest run the tab allows: steady arrivals at 0.5/s for 3 s, one slot, one policy
    page.locator("#load-pattern").get_by_label("steady").check()
    page.locator("#load-compare").get_by_label("compare with fixed 1.0 and 0.7").uncheck()
    for elem, value in (("load-rate", 0.5), ("load-duration", 3), ("load-slots", 1)):
        set_slider(page, elem, value)
    t0 = time.perf_counter()
    page.locator("#load-run").click()
    page.wait_for_function("document.querySelector('#load-note').innerText.includes('What this run shows')",
                           timeout=90_000)
    print(f"under load: a minimal run took {time.perf_counter() - t0:.1f} s")  # reported, not asserted
    note = page.locator("#load-note").inner_text()
    assert "adaptive" in note and "fixed 1" not in note and "fixed 0.7" not in note  # one policy, as chosen
    assert re.search(r"adaptive\*?\*? (meets|misses) the target: p95 latency \d", note.replace("*", "")), note
    assert page.locator("#load-note table tr").count() == 2  # header + one policy, rendered as a table
    assert "|---" not in note
    page.wait_for_selector("#load-front .js-plotly-plot .scatterlayer .trace", timeout=30_000)
    assert page.locator("#load-timeline .js-plotly-plot .scatterlayer .trace").count() == 3  # latency, queue, tau
    assert "adaptive" in page.locator("#load-front .scatterlayer .trace text").first.text_content()  # the point's label
    width = DESKTOP["viewport"]["width"] if device is DESKTOP else PHONE["viewport"]["width"]
    for plot in ("#load-timeline", "#load-front"):
        assert page.locator(f"{plot} .js-plotly-plot").bounding_box()["width"] <= width  # no sideways overflow
    page.wait_for_timeout(300)
    assert axe_violations(page) == []  # the figures and the summary
    name = "desktop" if device is DESKTOP else "phone"
    page.screenshot(path=os.path.join(ARTIFACTS, f"under-load-{name}.png"), full_page=True)
    page.context.close()
