"""What the browser tests share: Debian's Chromium driven by Python playwright, the app served on
a tiny random pair, the viewports (desktop, laptop, phone), page helpers and axe-core (vendored)."""
from __future__ import annotations

import os
import re
import shutil

import pytest

from app_fixtures import ROOT, free_port, pair  # noqa: F401 - the model pair fixture

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = os.path.join(ROOT, "test-artifacts")
AXE = os.path.join(ROOT, "tests", "vendor", "axe.min.js")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
DESKTOP = dict(viewport={"width": 1400, "height": 1000})
LAPTOP = dict(viewport={"width": 1366, "height": 768})
PHONE = dict(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, device_scale_factor=2)
XSS = '<img src=x onerror="window.__xss=1">'
XSS_AR = '<img src=y onerror="window.__xss=2">'

sync_api = pytest.importorskip("playwright.sync_api")
needs_chromium = pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM),
                                    reason="no Chromium at /usr/bin/chromium (apt-get install chromium)")

import app  # noqa: E402


def serve(pair, **overrides) -> tuple[str, object]:
    demo = app.build_app(*pair, frontier_max_n=4, batch_max=4, **overrides)
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return f"http://127.0.0.1:{port}/", demo


@pytest.fixture(scope="module")
def url(pair):
    address, demo = serve(pair)
    yield address
    demo.close()


@pytest.fixture(scope="module")
def one_slot_url(pair):
    """An app that runs one decode at a time: a second page has to queue."""
    address, demo = serve(pair, concurrency_limit=1)
    yield address
    demo.close()


@pytest.fixture(scope="module")
def short_url(pair):
    """An app whose answers stop at 16 tokens (the random fixture model never ends one): an Under
    load run of a few requests then takes seconds."""
    address, demo = serve(pair, max_new_tokens_cap=16)
    yield address
    demo.close()


@pytest.fixture(scope="module")
def browser():
    os.makedirs(ARTIFACTS, exist_ok=True)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(browser, url, device=DESKTOP):
    page = browser.new_context(**device).new_page()  # own context: own cookies, own session
    page.goto(url)
    page.wait_for_selector("#generate", timeout=30_000)
    return page


def open_tab(page, name: str) -> None:
    """Click a tab; on a narrow screen Gradio moves the tabs that do not fit under "More tabs"."""
    tab = page.get_by_role("tab", name=name)
    if not tab.count():
        page.get_by_role("button", name="More tabs").click()
        tab = page.locator(".overflow-dropdown button", has_text=name)
    tab.click()


def set_slider(page, elem_id: str, value) -> None:
    slider = page.locator(f"#{elem_id} input[type=range]")
    slider.fill(str(value))
    sync_api.expect(slider).to_have_value(str(value))  # held: not reset by a late mount


def fill_field(field, value: str, default: str) -> None:
    """Type into a text field a newly opened tab has just mounted. Gradio sets a field's initial
    value when the tab first renders, which can land after an early fill and overwrite it (seen
    in CI, not here): wait for that default first, then check the fill held."""
    sync_api.expect(field).to_have_value(default, timeout=30_000)
    field.fill(value)
    sync_api.expect(field).to_have_value(value, timeout=10_000)


def settings(page, tau=None, slow=None, max_new=None, ar_side=None):
    for elem, value in (("tau", tau), ("slow", slow), ("max-new", max_new)):
        if value is not None:
            set_slider(page, elem, value)
    if ar_side:
        page.locator("#more-settings").click()
        page.get_by_label(ar_side).check()


def example(page, i=0):
    page.locator("#examples button.gallery-item").nth(i).click()
    page.wait_for_function("document.querySelector('#prompt textarea').value.length > 0")


def steps_of(page, side: str) -> list[int]:
    pairs = page.eval_on_selector_all(f"#{side}-panel span.tok", "els => els.map(e => [+e.dataset.step, +e.dataset.n])")
    return [n for _, n in sorted(pairs)]


def status_of(page, side: str) -> str:
    return page.locator(f"#{side}-panel .mars-panel").get_attribute("data-status")


def wait_finished(page, timeout=90_000):
    for side in ("ar", "mars"):
        page.wait_for_selector(f"#{side}-panel .mars-panel:is([data-status=done], [data-status=limit], "
                               "[data-status=stopped])", timeout=timeout)
    page.wait_for_function("document.getElementById('stop').disabled", timeout=timeout)  # the run ended


def axe_violations(page) -> list[str]:
    page.add_script_tag(path=AXE)
    res = page.evaluate("async () => await axe.run(document, {runOnly: {type: 'tag', values: "
                        "['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})")
    return [f"{v['id']}: {[n['target'] for n in v['nodes']][:5]}" for v in res["violations"]]


