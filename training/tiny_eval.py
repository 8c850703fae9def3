"""What a Train-tab run is judged by: tokens per forward at tau 0.95 and accuracy at tau 0.95 and
tau 1 on held-out synthetic problems, at a few steps of the run and on the model it hands over.

Three sets of held-out problems, none of them the Playground's own examples (seed 0):
the run's checkpoints use `LIVE_SEED` (small, seconds per evaluation); `held_out_check`, the
figure a recipe is chosen by, uses `KEPT_SEED`, larger, beside the bundled AR model on the same
problems.
"""
from __future__ import annotations

import os
import time

import torch

from mars_core import DecodeConfig

BUNDLED_AR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "models", "tiny-ar-sft")
LIVE_SEED = 54  # the run's own checkpoints
KEPT_SEED = 7  # the recipe's bar: kept problems, never shown on the page
MAX_NEW = 224  # every held-out answer ends well before (the longest about 200 tokens with its prompt)


def problems(n: int, seed: int) -> list[dict]:
    from tasks.synthetic import make_examples

    return make_examples(n, seed, "eval")


class Evaluator:
    """Decodes `n` held-out problems in one batch at tau 0.95 and tau 1 (`training.evaluate.run_one`)."""

    def __init__(self, n: int = 16, seed: int = LIVE_SEED, max_new_tokens: int = MAX_NEW):
        self.examples = problems(n, seed)
        self.max_new = max_new_tokens

    @torch.no_grad()
    def run(self, model, tokenizer, block_size: int, step: int, clock=None) -> dict:
        from training.evaluate import run_one

        began = time.perf_counter()
        out = {"step": step}
        for tau, key in ((0.95, "095"), (1.0, "1")):
            cfg = DecodeConfig(mode="mars", tau=tau, block_size=block_size, max_new_tokens=self.max_new,
                               cache="sliding")
            r = run_one(model, tokenizer, self.examples, cfg, len(self.examples))
            out[f"tpf_{key}"], out[f"acc_{key}"] = r["tokens_per_forward"], r["accuracy"]
        out["n"], out["seconds"] = len(self.examples), time.perf_counter() - began
        if clock is not None:
            clock.eval_s = max(clock.eval_s, out["seconds"])
        return out


def build_model(result, init: str | None = None, prepack: bool | str = False):
    """(model, tokenizer) of a run's result: the AR checkpoint with the trained weights (paper) or
    with the trained adapters attached (gated), in eval mode. `prepack`: as `load_model`'s."""
    from mars_core import load_model
    from mars_core.gate import attach_gate, load_gate_state
    from mars_core.kernel_choice import apply_prepack

    model, tok = load_model(init or BUNDLED_AR, dtype=torch.float32, device="cpu")
    if result.recipe.objective == "paper":
        model.load_state_dict(result.state)
    else:
        attach_gate(model, tok.mask_token_id, result.recipe.rank, dtype=torch.float32)
        load_gate_state(model, result.state)
    model.eval()
    apply_prepack(model, prepack)  # last: a packed layer is derived from the weights loaded above
    return model, tok


def held_out_check(result, n: int = 100, seed: int = KEPT_SEED) -> dict:
    """The trained model on `n` kept problems at tau 0.95 and tau 1, and the bundled AR model's
    accuracy on the same problems: what the Train tab's default recipe was chosen by."""
    from mars_core import load_model
    from training.evaluate import run_one

    model, tok = build_model(result)
    got = Evaluator(n, seed).run(model, tok, result.recipe.block_size, result.steps)
    ar, ar_tok = load_model(BUNDLED_AR, dtype=torch.float32, device="cpu")
    base = run_one(ar, ar_tok, problems(n, seed), DecodeConfig(mode="ar", max_new_tokens=MAX_NEW, cache="sliding"), n)
    got.update(ar_accuracy=base["accuracy"], kept_seed=seed)
    return got
