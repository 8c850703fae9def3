"""What the page says about the loaded model before anything runs: its size, what it was trained
on, what it can answer, and that anything else gives nonsense by design."""
from __future__ import annotations

import html
import json
import os

from mars_core.gate import gate_of

from .exactness import gated_base
from .models import Loaded

REAL_DATA = "smollm2-self-distilled"  # the real fine-tune's training record (assets/models/smollm2-135m-mars)
FAMILIES = (
    ("arithmetic", "word problems with 1 to 3 steps of +, −, ×, ÷ (e.g. “Tom has 45 apples. He buys 23 more…”)"),
    ("unit conversion", "one conversion with a whole-number answer (e.g. “Convert 324 months to years.”)"),
    ("lists", "sort, reverse, max, min or sum of a short list (e.g. “What is the sum of [58, 64, 50, 37]?”)"),
)


def training_data(loaded: Loaded) -> str | None:
    """The `data` field of the folder's training record ("synthetic", a file name…), or None. A
    model trained on the Train tab has no folder and says it itself."""
    if getattr(loaded, "data", None):
        return loaded.data
    if loaded.folder() is None:
        return None
    try:
        with open(os.path.join(loaded.folder(), "training_config.json"), encoding="utf-8") as f:
            return json.load(f).get("args", {}).get("data")
    except (OSError, ValueError, AttributeError):
        return None


def parameters(loaded: Loaded) -> str:
    n = sum(p.numel() for p in loaded.model.parameters())
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def scope_html(mars: Loaded, ar: Loaded | None) -> str:
    """The "About this model" box above the prompt."""
    name = html.escape(mars.name)
    # a gated fine-tune beside the base it was trained on: the AR side is that very model
    same = ar is not mars and gated_base(mars, ar)
    ar_line = (f" The AR side runs <code>{html.escape(ar.name)}</code>, the base itself, one token per forward." if same else
               f" The AR side runs <code>{html.escape(ar.name)}</code>, the same architecture trained with plain "
               "next-token fine-tuning." if ar is not None else
               " There is no separate AR model: the AR side runs this model one token per forward.")
    if training_data(mars) == "synthetic":
        # short enough that Generate stays within a phone's first screen and a half; the detail folds
        fams = "".join(f"<li><b>{f}</b>: {html.escape(d)}</li>" for f, d in FAMILIES)
        return ('<div class="scope" id="scope-text"><b>About this model.</b> '
                f'<code>{name}</code> is a {parameters(mars)}-parameter Qwen2 trained from scratch <b>only</b> on '
                'arithmetic word problems, unit conversions and list operations; the examples below are held-out '
                'problems of these kinds, which it solves. <b>Anything else (general questions, chat) gives '
                'nonsense by design.</b><details><summary>What it was trained on</summary>'
                f'<ul>{fams}</ul>The model is tiny and has never seen other text. Free text is still allowed, to '
                f'watch how MARS behaves when the model is unsure.{ar_line}</details></div>')
    if training_data(mars) == REAL_DATA:
        small = ('A model this small writes fluent short answers, rewrites and simple facts; it often gets '
                 'arithmetic, less common facts and anything that needs several steps of reasoning wrong, in AR as '
                 'in MARS. ')
        if gate_of(mars.model) is not None:
            return ('<div class="scope" id="scope-text"><b>About this model.</b> '
                    f'<code>{name}</code> is SmolLM2-135M-Instruct ({parameters(mars)} parameters, Apache-2.0) with '
                    'MARS adapters trained on a 2-core CPU that act <b>only on the mask tokens</b>: every real token '
                    'is computed by the unchanged base, so its AR output is SmolLM2\'s own and the exact modes give '
                    f'exactly the base\'s answer, several tokens per forward where the masks guess right. {small}'
                    'At tau its masks accept a guess only where they are sure and never one that repeats the token '
                    'before it (the repeat guard), a little over one token per forward, '
                    'and a sure guess can still be wrong and change the answer: the exact modes are where it pays, '
                    'and they cannot change it; the model card gives the measured figures. '
                    f'{ar_line}</div>')
        return ('<div class="scope" id="scope-text"><b>About this model.</b> '
                f'<code>{name}</code> is SmolLM2-135M-Instruct ({parameters(mars)} parameters, Apache-2.0) '
                f'fine-tuned with MARS on a 2-core CPU, on its own answers to our prompts. {small}Its fine-tune is '
                'short, so most forwards still emit one token: the model card gives the measured tokens per forward. '
                f'{ar_line}</div>')
    return ('<div class="scope" id="scope-text"><b>About this model.</b> '
            f'<code>{name}</code> has {parameters(mars)} parameters. Its folder does not record its training '
            'data, so this page cannot say what it answers well: a MARS model answers what it was fine-tuned on, '
            f'and text far from that may come out as nonsense.{ar_line}</div>')
