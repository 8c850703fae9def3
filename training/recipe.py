"""The knobs of one `build_default` run (its own module, so the model cards can read a recipe
without importing the build)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    """The knobs of one build. `full()` is the bundled models' recipe, `smoke()` a minute-scale copy."""

    vocab_size: int
    tokenizer_examples: int
    model_config: str
    train_examples: int
    max_length: int
    batch_size: int
    ar_steps: int
    ar_lr: float
    mars_steps: int
    mars_lr: float
    ar_weight: float  # weight of the SFT (clean) loss in the MARS stage; the ablations use 0
    block_size: int
    ablation_block_sizes: tuple[int, ...]
    ablation_steps: int  # MARS steps of each "w/o SFT loss" run (same lr and data as the main run)
    draft_config: str  # preset of the small draft model (AR SFT, the AR stage's data and lr)
    draft_steps: int
    draft_tokens: int  # K of the draft's evaluation with the MARS target (mode="spec")
    eval_n: int
    eval_taus: tuple[float, ...]
    max_new_tokens: int
    save_every: int
    seed: int = 0

    @staticmethod
    def full() -> "Recipe":
        # Sized to a 2-hour build on a 2-core CPU. Each choice (AR lr and schedule, the MARS stage's
        # lr and heavy ar_weight, 600-step ablations) and the runs behind it: docs/experiments.md.
        return Recipe(vocab_size=512, tokenizer_examples=20000, model_config="tiny", train_examples=150000,
                      max_length=320, batch_size=32, ar_steps=5000, ar_lr=1e-3, mars_steps=1500, mars_lr=5e-4,
                      ar_weight=8.0, block_size=4, ablation_block_sizes=(4, 8), ablation_steps=600,
                      draft_config="draft", draft_steps=2000, draft_tokens=4, eval_n=500,
                      eval_taus=(1.0, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5), max_new_tokens=256, save_every=200)

    @staticmethod
    def smoke() -> "Recipe":
        return Recipe(vocab_size=300, tokenizer_examples=500, model_config="micro", train_examples=600,
                      max_length=320, batch_size=8, ar_steps=12, ar_lr=3e-3, mars_steps=8, mars_lr=1e-3,
                      ar_weight=1.0, block_size=4, ablation_block_sizes=(4,), ablation_steps=6,
                      draft_config="micro", draft_steps=6, draft_tokens=4, eval_n=12,
                      eval_taus=(1.0, 0.9, 0.5), max_new_tokens=48, save_every=5)
