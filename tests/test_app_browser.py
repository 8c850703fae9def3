"""The playground in a real browser: Debian's Chromium driven by Python playwright.

Load the page, click an example, Generate, both panels finish with coloured token spans and the
gauge renders; move the tau slider down in the middle of a long generation and later steps
accept more tokens; two pages at once do not interfere. Screenshots go to test-artifacts/.
"""
from __future__ import annotations

import os
import shutil
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = os.path.join(ROOT, "test-artifacts")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM),
                                reason="no Chromium at /usr/bin/chromium (apt-get install chromium)")

import app  # noqa: E402
from test_app import free_port, save_pair  # noqa: E402


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    torch.set_num_threads(1)
    pair = save_pair(str(tmp_path_factory.mktemp("browser-models")))
    demo = app.build_app(*pair, step_delay=0.02, render_interval=0.05, max_new_tokens_cap=256,
                         frontier_max_n=4, batch_max=4)
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="module")
def browser():
    os.makedirs(ARTIFACTS, exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(browser, url):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1500})  # own cookies: own session
    page = ctx.new_page()
    page.goto(url)
    page.wait_for_selector("#generate", timeout=30_000)
    return page


def steps_of(page, side: str) -> list[int]:
    """Tokens accepted per step, in step order, read from the coloured spans."""
    pairs = page.eval_on_selector_all(
        f"#{side}-panel span.tok", "els => els.map(e => [+e.dataset.step, +e.dataset.n])")
    return [n for _, n in sorted(pairs)]


def set_slider(page, elem_id: str, value) -> None:
    page.locator(f"#{elem_id} input[type=range]").fill(str(value))


def wait_done(page, timeout=90_000):
    for side in ("ar", "mars"):
        page.wait_for_selector(f"#{side}-panel .mars-panel[data-status=done]", timeout=timeout)


def test_example_generate_and_gauge(browser, url):
    page = open_page(browser, url)
    page.locator("#examples button.gallery-item").first.click()
    page.wait_for_function("document.querySelector('#prompt textarea').value.length > 0")
    set_slider(page, "tau", 0.5)
    set_slider(page, "max-new", 48)
    page.locator("#generate").click()
    wait_done(page)
    assert page.locator("#ar-panel span.tok").count() == 48  # AR: one token per step
    n_mars = page.locator("#mars-panel span.tok").count()
    assert 0 < n_mars < 48
    assert "step 1:" in page.locator("#mars-panel span.tok").first.get_attribute("title")
    assert page.locator("#mars-panel span.tok").first.evaluate("e => getComputedStyle(e).backgroundColor") \
        not in ("", "rgba(0, 0, 0, 0)")
    page.wait_for_selector("#gauge .js-plotly-plot .indicatorlayer", timeout=30_000)
    assert page.locator("#compare [data-agree]").count() == 1
    assert page.locator("#steps-chart rect.bar").count() == n_mars
    page.screenshot(path=os.path.join(ARTIFACTS, "playground.png"), full_page=True)
    page.context.close()


def test_live_tau_on_one_page_leaves_the_other_alone(browser, url):
    a, b = open_page(browser, url), open_page(browser, url)
    for page in (a, b):
        page.locator("#prompt textarea").fill("What is 24 * 3?")
        set_slider(page, "tau", 1)
        set_slider(page, "max-new", 200)
        page.get_by_label("MARS model at 1 token/step").check()
    a.locator("#generate").click()
    b.locator("#generate").click()
    b.wait_for_function("document.querySelectorAll('#mars-panel span.tok').length >= 15", timeout=60_000)
    set_slider(b, "tau", 0)  # mid-generation, page b only
    b.wait_for_timeout(300)
    b.screenshot(path=os.path.join(ARTIFACTS, "live-tau-running.png"), full_page=True)
    wait_done(b)
    wait_done(a)
    steps_b, steps_a = steps_of(b, "mars"), steps_of(a, "mars")
    assert sum(steps_b) == 200 and sum(steps_a) == 200
    assert steps_b[:10] == [1] * 10  # before the slider moved
    assert sum(steps_b[-10:]) / 10 > 2 and max(steps_b) == 4  # after: whole blocks
    assert steps_a == [1] * 200  # the other page kept tau = 1
    assert b.locator("#steps-chart rect.bar[data-n='4']").count() > 0
    b.screenshot(path=os.path.join(ARTIFACTS, "live-tau-done.png"), full_page=True)
    a.screenshot(path=os.path.join(ARTIFACTS, "other-page.png"), full_page=True)
    a.context.close()
    b.context.close()


def test_other_tabs(browser, url):
    page = open_page(browser, url)
    page.locator("#prompt textarea").fill("Hi")
    set_slider(page, "tau", 0.3)
    set_slider(page, "max-new", 24)
    page.locator("#generate").click()
    wait_done(page)
    page.get_by_role("tab", name="Frontier").click()
    page.wait_for_selector("#frontier-plot .js-plotly-plot", timeout=30_000)
    assert "Precomputed sweep" in page.locator("#frontier-note").inner_text()
    page.screenshot(path=os.path.join(ARTIFACTS, "frontier.png"), full_page=True)
    page.get_by_role("tab", name="Batch & KV cache").click()
    page.locator("#batch-run").click()
    page.wait_for_selector("#batch-plot .js-plotly-plot", timeout=60_000)
    assert "Speed-up of MARS over AR" in page.locator("#batch-summary").inner_text()
    page.screenshot(path=os.path.join(ARTIFACTS, "batch.png"), full_page=True)
    page.get_by_role("tab", name="How it works").click()
    page.locator("#window-show").click()
    page.wait_for_selector("#window-plot .js-plotly-plot", timeout=30_000)
    page.wait_for_selector("#mask-plot .js-plotly-plot", timeout=30_000)
    page.screenshot(path=os.path.join(ARTIFACTS, "how-it-works.png"), full_page=True)
    page.get_by_role("tab", name="Models").click()
    page.locator("#mars-source textarea, #mars-source input").first.fill("/no/such/folder")
    page.get_by_role("radio", name="custom").check()
    page.locator("#load-models").click()
    toast = page.locator(".toast-body, [data-testid='toast-body']").first
    toast.wait_for(timeout=30_000)
    assert "does not exist" in toast.inner_text() and "/no/such" not in toast.inner_text()
    page.screenshot(path=os.path.join(ARTIFACTS, "models-error.png"), full_page=True)
    page.context.close()
