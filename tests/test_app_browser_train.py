"""The Train tab and the MARS side's mode choice in Chromium, as a newcomer meets them: a short run
drawn live to the end, then one click races the model in the Playground; the phone layout; axe-core
clean on both. Screenshots in test-artifacts/ (train-*.png, mode-line-*.png)."""
from __future__ import annotations

import os

import pytest

from browser_fixtures import (  # noqa: F401 - the fixtures are used by name
    ARTIFACTS, DESKTOP, PHONE, axe_violations, browser, example, needs_chromium, open_page, open_tab, pair, serve,
    set_slider, wait_finished)

pytestmark = [needs_chromium, pytest.mark.skipif(
    not os.path.isdir(os.path.join(os.path.dirname(ARTIFACTS), "assets", "models", "tiny-ar-sft")),
    reason="the bundled AR model is not built")]


@pytest.fixture(scope="module")
def train_url(pair):  # noqa: F811
    address, demo = serve(pair, train_eval_n=2, train_threads=1, max_new_tokens_cap=48)
    yield address
    demo.close()


def test_a_short_run_then_race_it_in_the_playground(browser, train_url):
    page = open_page(browser, train_url)
    open_tab(page, "Train")
    page.wait_for_selector("#train-go", state="visible")
    assert "No run yet" in page.locator("#train-progress").inner_text()
    assert page.locator("#train-race button, button#train-race").first.is_disabled()
    set_slider(page, "train-steps", 10)
    page.locator("#train-go").click()
    page.wait_for_function("document.querySelector('#train-progress-text')?.textContent.includes('step ')",
                           timeout=90_000)
    page.screenshot(path=os.path.join(ARTIFACTS, "train-running.png"), full_page=True)
    page.wait_for_selector("#train-status .run-status[data-kind=done]", timeout=180_000)
    status = page.locator("#train-status").inner_text()
    assert "Finished after 10 steps" in status and "tokens per forward at tau 0.95" in status.lower()
    assert page.locator("#train-table tbody tr").count() == 5  # step 0 and four evaluations
    assert page.locator("#train-progress [role=progressbar]").get_attribute("aria-valuenow") == "10"
    page.screenshot(path=os.path.join(ARTIFACTS, "train-done.png"), full_page=True)
    assert axe_violations(page) == []
    page.locator("#train-race").click()
    page.wait_for_selector("#tab-playground", state="visible", timeout=30_000)  # the Playground opened
    page.wait_for_function("document.querySelector('#mars-panel').textContent.includes('your MARS model')",
                           timeout=30_000)
    assert "your MARS model (gated, B = 4, 10 steps)" in page.locator("#model-status").inner_text()
    example(page)
    set_slider(page, "slow", 0)
    page.locator("#generate").click()
    try:
        wait_finished(page)
    finally:
        page.screenshot(path=os.path.join(ARTIFACTS, "train-raced.png"), full_page=True)
    assert "tiny-ar-sft" in page.locator("#ar-panel").inner_text()
    page.screenshot(path=os.path.join(ARTIFACTS, "train-raced.png"), full_page=True)
    page.context.close()


def test_train_tab_on_a_phone(browser, train_url):
    page = open_page(browser, train_url, PHONE)
    open_tab(page, "Train")
    page.wait_for_selector("#train-go", state="visible")
    for plot in ("#train-losses", "#train-evals"):  # drawn once the tab opens: axe reads the page as shown
        page.wait_for_selector(f"{plot} .js-plotly-plot", timeout=30_000)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390 + 1, f"the page scrolls sideways on a phone ({width} px)"
    page.screenshot(path=os.path.join(ARTIFACTS, "train-phone.png"), full_page=True)
    assert axe_violations(page) == []
    page.context.close()


@pytest.mark.parametrize("device", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_mars_side_mode_is_one_click_and_said_in_a_line(browser, train_url, device):
    page = open_page(browser, train_url, device)
    line = page.locator("#mode-line-text")
    line.wait_for(state="visible")
    page.wait_for_function("document.querySelector('#mode-line-text').textContent.includes('exact, fastest here:')")
    assert "MARS at tau" in line.inner_text()
    radio = page.locator("#mars-mode")
    assert radio.get_by_label("MARS at tau").is_checked()  # the tiny pair starts in tau mode
    radio.get_by_label("exact, fastest here").check()  # one click
    example(page)
    set_slider(page, "slow", 0)
    set_slider(page, "max-new", 24)
    if device is DESKTOP:
        page.locator("#more-settings").click()
        page.get_by_label("MARS model at 1 token/step").check()
    page.locator("#generate").click()
    wait_finished(page)
    assert "MARS exact, fastest here" in page.locator("#mars-panel").inner_text()
    if device is DESKTOP:
        assert page.locator("#compare [data-guaranteed='1']").count() == 1  # float32: guaranteed identical
    name = "desktop" if device is DESKTOP else "phone"
    page.locator("#mode-line").scroll_into_view_if_needed()
    page.screenshot(path=os.path.join(ARTIFACTS, f"mode-line-{name}.png"), full_page=device is DESKTOP)
    assert axe_violations(page) == []
    page.context.close()
