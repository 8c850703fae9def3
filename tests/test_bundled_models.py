"""The bundled default models: a functional check, not a benchmark.

The prompts are held-out synthetic problems (eval split, seed 0) that both bundled models
solve; they guard against a broken checkpoint, tokenizer or decoder, not measure accuracy (the
model cards report accuracy on 500 problems).
"""
import os
import re

import pytest

from mars_core import DecodeConfig, generate, load_model
from tasks.synthetic import score

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "models")
CASES = [
    ("Aisha owns 287 tickets. Aisha fills 13 boxes with that many each. How many tickets are there in the end?",
     "3731"),
    ("Ines has 134 stickers. Ines donates 69 stickers. A friend gives Ines 42 more. "
     "How many stickers does Ines have at the end?", "107"),
    ("How many hours are in 1740 minutes?", "29"),
    ("What is 5 kilograms in grams?", "5000"),
    ("Dan has cards showing [15, 82, 55, 93, 24, 80, 78]. Sort them from smallest to largest.",
     "[15, 24, 55, 78, 80, 82, 93]"),
    ("What is the sum of [81, 80, 71, 91]?", "323"),
]


@pytest.fixture(scope="module")
def models():
    return {name: load_model(os.path.join(ROOT, name), device="cpu") for name in ("tiny-ar-sft", "tiny-mars-b4")}


def test_ar_baseline_solves_fixed_problems(models):
    model, tok = models["tiny-ar-sft"]
    res = generate(model, tok, [q for q, _ in CASES], DecodeConfig(mode="ar", max_new_tokens=256))
    assert [score(t, a) for t, (_, a) in zip(res.texts, CASES)] == [True] * len(CASES)


def test_mars_solves_them_with_several_tokens_per_forward(models):
    model, tok = models["tiny-mars-b4"]
    prompts = [q for q, _ in CASES]
    fast = generate(model, tok, prompts, DecodeConfig(mode="mars", tau=0.95, block_size=4, max_new_tokens=256))
    assert [score(t, a) for t, (_, a) in zip(fast.texts, CASES)] == [True] * len(CASES)
    assert fast.stats.tokens_per_forward > 1.3
    one = generate(model, tok, prompts, DecodeConfig(mode="mars", tau=1.0, block_size=4, max_new_tokens=256))
    ar = generate(model, tok, prompts, DecodeConfig(mode="ar", max_new_tokens=256))
    assert one.token_ids == ar.token_ids  # tau = 1 is exactly AR


def test_bundled_models_are_small_safetensors_folders():
    for name in ("tiny-ar-sft", "tiny-mars-b4"):
        folder = os.path.join(ROOT, name)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        assert size < 25 * 2**20
        assert os.path.isfile(os.path.join(folder, "model.safetensors"))
        assert os.path.isfile(os.path.join(folder, "README.md"))


# Every prompt the snippets of README.md and docs/ use, with its answer: a new one without
# an answer here fails test_readme_prompts_are_all_listed.
README_PROMPTS = {
    "Convert 324 months to years.": "27",
    "What is the sum of [58, 64, 50, 37]?": "209",
}


def readme_prompts() -> set[str]:
    """The question-like string literals of the ```python blocks of README.md and docs/*.md."""
    import glob

    repo = os.path.dirname(os.path.dirname(ROOT))
    blocks = []
    for path in [os.path.join(repo, "README.md"), *sorted(glob.glob(os.path.join(repo, "docs", "*.md")))]:
        with open(path, encoding="utf-8") as f:
            blocks += re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    return {s for b in blocks for s in re.findall(r'"([^"\n]+ [^"\n]*[?.])"', b)}


def offered_examples() -> dict[str, str]:
    """What the playground offers, with answers: its example buttons (held-out problems drawn by
    `_examples` from make_examples(30, 0, "eval")), the complete example prompts of the scope text,
    and the README's prompts."""
    from playground.scope import FAMILIES
    from playground.tab_playground import _examples
    from tasks.synthetic import make_examples

    answers = {ex["messages"][0]["content"]: ex["answer"] for ex in make_examples(30, 0, "eval")}
    answers.update(README_PROMPTS)
    shown = [q for [q] in _examples()]
    shown += [q for _, d in FAMILIES for q in re.findall(r"“([^”]+)”", d) if not q.endswith("…")]
    missing = [q for q in shown if q not in answers]
    assert not missing, f"no known answer for {missing}: add it to README_PROMPTS"
    return {q: answers[q] for q in dict.fromkeys(shown + list(README_PROMPTS))}


@pytest.fixture(scope="module")
def core():
    """The bundled pair as the app loads it (its store, its limits)."""
    from playground.core import AppOptions, Core

    return Core(os.path.join(ROOT, "tiny-mars-b4"), os.path.join(ROOT, "tiny-ar-sft"), AppOptions(device="cpu"))


def test_readme_prompts_are_all_listed():
    assert readme_prompts() == set(README_PROMPTS)


@pytest.mark.parametrize("side", ["ar", "mars"])
def test_every_offered_example_is_answered_within_the_default_token_limit(core, side):
    """Each example the page offers (and each README prompt) is answered correctly, and ends with
    EOS before the playground's default max new tokens, by the AR baseline (AR decoding) and by
    the MARS model at tau 0.95, decoded as the playground decodes them (sliding cache, greedy)."""
    limit = min(core.opts.default_max_new_tokens, core.max_new_cap())  # the max-new-tokens slider's default
    cases = offered_examples()
    assert len(cases) >= 6  # two per family on the page; the README and scope prompts are among them
    loaded = core.ar if side == "ar" else core.mars
    cfg = (DecodeConfig(mode="ar", cache="sliding", max_new_tokens=limit) if side == "ar" else
           DecodeConfig(mode="mars", tau=0.95, block_size=core.default_block, cache="sliding", max_new_tokens=limit))
    res = generate(loaded.model, loaded.tokenizer, list(cases), cfg)
    wrong = [(q, a, t) for (q, a), t in zip(cases.items(), res.texts) if not score(t, a)]
    assert not wrong, wrong
    at_limit = [q for q, ids in zip(cases, res.token_ids) if len(ids) >= limit]
    assert not at_limit, f"stopped at the {limit}-token limit: {at_limit}"
