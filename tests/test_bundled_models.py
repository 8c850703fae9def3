"""The bundled default models: a functional check, not a benchmark.

The prompts are held-out synthetic problems (eval split, seed 0) that both bundled models
solve; they guard against a broken checkpoint, tokenizer or decoder, not measure accuracy (the
model cards report accuracy on 500 problems).
"""
import os

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
