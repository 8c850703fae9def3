"""A scripted model: a real tiny Qwen2 runs every forward, but its logits are replaced by a script.

The script depends only on the absolute position p being predicted and on what kind of column
predicts it: a real token (the AR prediction, `ar(p)`) or a [MASK] (`mask(p)`, a MARS mask
prediction). Each prediction is a token and a confidence level whose probability is exact in
float32 (the token's logit is 0, `d` distractors at the top of the vocabulary also 0, the rest
-inf, so p = 1 / (1 + d) and argmax picks the token, the lowest index). So a confidence can sit
exactly on tau (EDGE = 0.5) and the tests' expectations are written from the rules of the spec,
never produced by the code under test.
"""
from __future__ import annotations

import torch

HIGH, EDGE, LOW = 1.0, 0.5, 0.25
DISTRACTORS = {HIGH: 0, EDGE: 1, LOW: 3}
N_DISTRACT = 3  # the top ids, never a scripted token


def every(p: int, n: int | None, at: int = 0) -> bool:
    return bool(n) and p % n == at


class Script:
    """Predictions per position. `eos_every`: EOS at every p with p % eos_every == 0 (AR and mask);
    `ar_wrong` / `mask_wrong`: at p % that == 0 the prediction differs from the base sequence
    (for the AR script of a draft model, a wrong draft; for the mask script, a wrong MARS guess);
    `mask_low` / `mask_edge`: where the mask prediction is LOW / exactly EDGE (else HIGH);
    `mask_repeat`: at p % that == 2 the mask predicts base(p - 1), the token before its target."""

    def __init__(self, vocab: int, eos: int, first_free: int, mask_id: int | None = None, *,
                 eos_every: int | None = 13, ar_wrong: int | None = None, mask_wrong: int | None = 7,
                 mask_low: int | None = 5, mask_edge: int | None = 3, ar_low: int | None = None,
                 ar_wrong_at: int = 0, mask_repeat: int | None = None):
        self.vocab, self.eos, self.first_free, self.mask_id = vocab, eos, first_free, mask_id
        self.eos_every, self.ar_wrong, self.mask_wrong = eos_every, ar_wrong, mask_wrong
        self.mask_low, self.mask_edge, self.ar_low, self.ar_wrong_at = mask_low, mask_edge, ar_low, ar_wrong_at
        self.mask_repeat = mask_repeat
        self.span = vocab - first_free - N_DISTRACT

    def base(self, p: int) -> int:
        """The token the sequence has at position p (what an exact decode emits)."""
        if every(p, self.eos_every):
            return self.eos
        return self.first_free + (7 * p) % self.span

    def _other(self, p: int) -> int:
        return self.first_free + (7 * p + 1) % self.span  # never base(p)

    def ar(self, p: int) -> tuple[int, float]:
        token = self._other(p) if every(p, self.ar_wrong, self.ar_wrong_at) else self.base(p)
        return token, LOW if every(p, self.ar_low) else HIGH

    def mask(self, p: int) -> tuple[int, float]:
        token = self._other(p) if every(p, self.mask_wrong) else self.base(p)
        if every(p, self.mask_repeat, at=2):
            token = self.base(p - 1)
        if every(p, self.mask_low):
            return token, LOW
        return token, EDGE if every(p, self.mask_edge, at=1) else HIGH

    def logits(self, pos: torch.Tensor, is_mask: torch.Tensor) -> torch.Tensor:
        """pos, is_mask (R, K): the kept columns' positions (they predict pos + 1) and kinds -> (R, K, V)."""
        R, K = pos.shape
        out = torch.full((R, K, self.vocab), float("-inf"))
        for r in range(R):
            for c in range(K):
                p = int(pos[r, c]) + 1
                token, level = self.mask(p) if is_mask[r, c] else self.ar(p)
                out[r, c, token] = 0.0
                for d in range(DISTRACTORS[level]):
                    out[r, c, self.vocab - 1 - d] = 0.0
        return out


def attach(model, script: Script):
    """Hooks that replace the model's logits with the script's; returns the handles."""
    seen = {}

    def pre(module, args, kwargs):
        cache = kwargs.get("cache")
        seen["past"] = cache.get_seq_length() if cache is not None else 0

    def post(module, args, kwargs, out):
        ids = kwargs["input_ids"]  # (R, W)
        R, W = ids.shape
        pos = kwargs.get("position_ids")
        if pos is None:  # the batch-1 sliding path: positions follow the cache length
            pos = seen["past"] + torch.arange(W)[None].expand(R, W)
        keep = kwargs.get("logits_to_keep", 0)
        if isinstance(keep, int):
            cols = torch.arange(W - keep if keep else 0, W)[None].expand(R, -1)
        elif keep.dim() == 1:
            cols = keep[None].expand(R, -1)
        else:
            cols = keep  # (R, K): per-row columns
        is_mask = ids.gather(1, cols) == script.mask_id if script.mask_id is not None else torch.zeros_like(cols, dtype=torch.bool)
        out.logits = script.logits(pos.gather(1, cols), is_mask).to(out.logits.dtype)
        return out

    return [model.register_forward_pre_hook(pre, with_kwargs=True),
            model.register_forward_hook(post, with_kwargs=True)]


def scripted_model(tokenizer, kind: str = "qwen2", seed: int = 0, **script_kw):
    """A tiny model of `kind` whose logits follow a `Script` (keyword options as Script's);
    returns (model, script). The hooks stay for the model's life."""
    from conftest import make_model

    model = make_model(kind, len(tokenizer), seed=seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    script = Script(len(tokenizer), tokenizer.eos_token_id, len(tokenizer.all_special_ids), tokenizer.mask_token_id,
                    **script_kw)
    attach(model, script)
    return model, script


def cut(out: list[int], emitted: list[int], eos: int, max_new: int) -> tuple[int, bool]:
    """The rule every decoder ends a step by: keep `emitted` up to its first EOS and up to the
    budget. Returns (tokens kept, the sequence is done)."""
    stop = emitted.index(eos) if eos in emitted else None
    take = min(len(emitted) if stop is None else stop, max_new - len(out))
    return take, stop is not None or len(out) + take >= max_new
