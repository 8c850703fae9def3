"""Shared by the playground tests: a tiny model pair saved to a temp folder (CPU only, nothing
downloaded), the app built on it, and helpers that call the handlers as Gradio would."""
from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import app  # noqa: E402
from conftest import make_model, make_tokenizer  # noqa: E402
from playground.duel import AR_SIDES  # noqa: E402
from playground.errors import guard  # noqa: E402
from playground.session import Session  # noqa: E402

PROMPT = "What is 24 * 3?"
EVAL = {"n": 3, "seed": 0, "split": "eval", "runs": [
    {"model": "ar-baseline", "mode": "ar", "tau": 0.95, "block_size": 1, "accuracy": 0.2,
     "accuracy_by_family": {}, "tokens_per_forward": 1.0, "tokens_per_second": 100.0},
    {"model": "mars", "mode": "mars", "tau": 0.9, "block_size": 4, "accuracy": 0.3,
     "accuracy_by_family": {}, "tokens_per_forward": 1.8, "tokens_per_second": 170.0, "matches_ar": 0.5},
]}
HANG_S = 120.0  # a call queued behind held jobs fails after this; held jobs wait twice as long


def held(fn, release: threading.Event):
    """fn, waiting for release first: a long job that holds its slot for sure however slow the
    machine, without using the CPU, until the test has looked."""
    def wrapper(*args, **kwargs):
        release.wait(2 * HANG_S)
        return fn(*args, **kwargs)
    return wrapper


OUT = ("status", "ar", "mars", "speed", "steps", "compare", "replay_step", "replay")  # generate's outputs


def save_pair(root) -> tuple[str, str]:
    """A confident MARS stand-in (LM head x30: tau=1 gives 1 token/step, tau=0 gives B) and a plain AR."""
    tok = make_tokenizer()
    paths = []
    for name, seed, scale in (("fixture-mars", 1, 30.0), ("fixture-ar", 0, 1.0)):
        m = make_model("qwen2", len(tok), seed=seed, head_scale=scale)
        m.generation_config.eos_token_id = tok.eos_token_id
        path = os.path.join(root, name)
        m.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(path)
    with open(os.path.join(paths[0], "eval.json"), "w") as f:
        json.dump(EVAL, f)
    return paths[0], paths[1]


class Tabs:
    """The handlers of every tab of one app: tabs.playground.generate(...), tabs.models.load(...)."""

    def __init__(self, demo):
        self.core = demo.core
        for name, tab in demo.tabs.items():
            setattr(self, name, tab)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.set_num_threads(1)
    return save_pair(str(tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="module")
def demo(pair):
    torch.set_num_threads(1)
    return app.build_app(*pair, max_seconds=60, frontier_max_n=8, batch_max=4)


@pytest.fixture
def pg(demo):
    return Tabs(demo)


def run_ui(pg, session=None, prompt=PROMPT, tau=0.9, block=4, metric="probability", temperature=0.0, seed=0,
           max_new=40, cache="sliding", ar_side=AR_SIDES[0], slow_ms=0) -> list[dict]:
    """Every update `generate` yields, as dicts keyed by OUT."""
    session = session or Session()
    outs = pg.playground.page_generate(prompt, tau, block, metric, temperature, seed, max_new, cache, ar_side,
                                         slow_ms, session)
    return [dict(zip(OUT, o)) for o in outs]


def spans(html_text: str) -> list[tuple[int, int]]:
    return [(int(s), int(n)) for s, n in re.findall(r'class="tok" tabindex="0" data-step="(\d+)" data-n="(\d+)"',
                                                    html_text)]


def figure(html_text: str, key: str) -> float:
    """A number shown in a panel (data-k=key) or the speed gauge."""
    m = re.search(rf'data-k="{key}">[^<]*<b>([\d.]+)', html_text) or \
        re.search(rf'data-k="{key}">([\d.]+)', html_text)
    return float(m.group(1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
