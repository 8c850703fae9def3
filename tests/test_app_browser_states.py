"""Every way a run can end, in Chromium, desktop and phone (playground.runs): done, stopped,
cancelled while queued, refused by a full queue, and an error. Each must leave a true status
line, Stop disabled, no red "Error" pill, no toast (an error is said once, in place), and a page
axe-core finds clean.

The app here has one decode slot, one job slot and a queue of one for each (Gradio's for the
generations, playground.job_queue's for the long jobs): a first page runs, a second waits, a third
is refused.
"""
from __future__ import annotations

import os
import time

import pytest

from browser_fixtures import (  # noqa: F401 - the fixtures are used by name
    ARTIFACTS, DESKTOP, PHONE, axe_violations, browser, example, needs_chromium, open_page, open_tab, pair, serve,
    set_slider, settings, sync_api)

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def tight_url(pair):
    address, demo = serve(pair, concurrency_limit=1, job_concurrency=1, max_queue=1, job_queue=1, max_new_tokens_cap=64)
    yield address
    demo.close()


def kind(page, status: str) -> str | None:
    return page.evaluate(f"document.querySelector('{status} .run-status')?.dataset.kind")


def wait_kind(page, status: str, expected: str, timeout=90_000) -> None:
    page.wait_for_function(f"document.querySelector('{status} .run-status')?.dataset.kind === '{expected}'",
                           timeout=timeout)


def assert_settled(page, status: str, expected: str, words: str, shot: str) -> None:
    """The run is over: a true status, Stop off, no error pill, no toast, axe clean."""
    wait_kind(page, status, expected)
    page.wait_for_timeout(800)  # late updates (a failure listener, a toast) would land by now
    assert kind(page, status) == expected
    assert words in page.locator(status).inner_text()
    if expected in ("rejected", "cancelled", "error"):  # nothing in the panels says why: the line must be seen
        box = page.locator(status).bounding_box()  # a phone scrolled down to the panels comes back to it
        assert -1 <= box["y"] and box["y"] + box["height"] <= page.viewport_size["height"] + 1, (shot, box)
    if page.locator("#stop").is_visible():
        assert page.locator("#stop").is_disabled(), shot
    if status == "#run-status":  # whatever ended the run, Generate is back
        sync_api.expect(page.locator("#generate")).to_be_enabled(timeout=5_000)
    pills = page.locator("[data-testid=status-tracker]:visible", has_text="Error")
    assert pills.count() == 0, shot
    toasts = page.locator(".toast-item:visible")
    assert toasts.count() == 0, (shot, toasts.all_inner_texts())
    page.screenshot(path=os.path.join(ARTIFACTS, f"end-{shot}.png"))
    assert axe_violations(page) == [], shot


@pytest.mark.parametrize("device", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_every_end_of_a_generation(browser, tight_url, device):
    tag = "phone" if device is PHONE else "desktop"
    running, waiting, refused = (open_page(browser, tight_url, device) for _ in range(3))
    for page in (running, waiting, refused):
        example(page)
        settings(page, tau=1, slow=150, max_new=60)
    running.locator("#generate").click()
    running.wait_for_selector("#mars-panel span.tok", timeout=60_000)
    waiting.locator("#generate").click()
    wait_kind(waiting, "#run-status", "queued")
    waiting.wait_for_function("document.querySelector('#run-status').innerText.includes('queue:')", timeout=30_000)
    refused.locator("#generate").click()  # the queue (of one) is full
    assert_settled(refused, "#run-status", "rejected", "queue is full", f"{tag}-rejected")

    waiting.locator("#stop").click()
    assert_settled(waiting, "#run-status", "cancelled", "Cancelled", f"{tag}-cancelled")
    running.locator("#stop").click()
    assert_settled(running, "#run-status", "stopped", "Stopped", f"{tag}-stopped")

    refused.locator("#prompt textarea").fill("   ")
    refused.locator("#generate").click()
    assert_settled(refused, "#run-status", "error", "The prompt is empty", f"{tag}-error")
    assert refused.locator("#run-status").inner_text().count("The prompt is empty") == 1

    example(waiting)
    settings(waiting, slow=0, max_new=8)
    waiting.locator("#generate").click()
    assert_settled(waiting, "#run-status", "done", "Done", f"{tag}-done")
    for page in (running, waiting, refused):
        page.context.close()


def test_generate_is_off_while_a_run_plays(browser, tight_url):
    """One run per page: a second Generate (a click, or Enter in the prompt) while a run plays
    would start a second duel into the same panels, and the first one's end would switch Stop off
    under the second. So Generate is disabled from the click until the run has ended."""
    page = open_page(browser, tight_url)
    generate, stop = page.locator("#generate"), page.locator("#stop")
    example(page)
    settings(page, tau=1, slow=100, max_new=40)
    generate.click()
    page.wait_for_selector("#mars-panel span.tok", timeout=60_000)
    sync_api.expect(generate).to_be_disabled()
    page.locator("#prompt textarea").press("Enter")  # Enter runs the prompt: not while a run plays
    page.wait_for_timeout(500)
    assert kind(page, "#run-status") == "run" and stop.is_enabled()
    page.screenshot(path=os.path.join(ARTIFACTS, "generate-off-while-running.png"))
    stop.click()
    assert_settled(page, "#run-status", "stopped", "Stopped", "generate-back-after-stop")
    assert page.locator("#mars-panel span.tok").count() < 40  # the one run, stopped; no second one resumed

    settings(page, slow=0, max_new=8)
    generate.click()
    sync_api.expect(generate).to_be_disabled()
    assert_settled(page, "#run-status", "done", "Done", "generate-back-after-done")
    page.context.close()


def test_every_end_of_a_long_job(browser, tight_url, monkeypatch):
    import benchmarks.load

    real = benchmarks.load.run_load

    def slow_run_load(*args, **kwargs):  # the simulation skips idle time: hold the job slot for sure
        time.sleep(8)
        return real(*args, **kwargs)

    monkeypatch.setattr(benchmarks.load, "run_load", slow_run_load)  # imported by the tab at each run
    running, waiting, refused = (open_page(browser, tight_url) for _ in range(3))
    open_tab(running, "Under load")
    running.wait_for_selector("#load-run", timeout=30_000)
    running.locator("#load-pattern").get_by_label("steady").check()
    running.locator("#load-compare").get_by_label("compare with fixed 1.0 and 0.7").uncheck()
    for elem, value in (("load-rate", 0.5), ("load-duration", 3), ("load-slots", 1)):
        set_slider(running, elem, value)
    running.locator("#load-run").click()
    wait_kind(running, "#load-status", "run")
    open_tab(waiting, "Batch & KV cache")
    waiting.locator("#batch-run").click()
    wait_kind(waiting, "#batch-status", "queued")
    # in the long-job queue, not only marked queued: it says its place in line
    sync_api.expect(waiting.locator("#batch-status")).to_contain_text("1 long job ahead of yours", timeout=30_000)
    open_tab(refused, "Batch & KV cache")
    refused.locator("#batch-run").click()
    assert_settled(refused, "#batch-status", "rejected", "queue is full", "job-rejected")

    assert_settled(running, "#load-status", "done", "Done", "job-done-load")
    assert_settled(waiting, "#batch-status", "done", "Done", "job-done-batch")

    open_tab(refused, "Frontier")  # the queue is free again: this one runs, and fails on its input
    refused.get_by_label("taus").fill("0.9, lots")
    refused.locator("#frontier-run").click()
    assert_settled(refused, "#frontier-status", "error", "tau must be a number", "job-error")
    for page in (running, waiting, refused):
        page.context.close()
