"""Every decoder against an expectation computed without any decoder: a scripted model.

A real tiny Qwen2 runs every forward (so the caches, masks, positions and `logits_to_keep` of each
decoder are exercised), but a forward hook replaces its logits with a script that depends only on
the absolute position being predicted: the token at position p is `TOKEN[p]` with probability
`CONF[p]`. So the output of a prompt of L tokens is known in advance: the tokens from position L
on, accepted left to right while the confidence passes tau (the first of each block always), cut
at the first EOS and at `max_new_tokens`. `expected` computes that with a plain loop.

The script puts EOS at positions that rows reach at different offsets inside a block, including
mid-block after accepted tokens, and confidences that make rows accept 1 to B tokens per step.
"""
from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS, make_model
from mars_core import DecodeConfig, generate
from mars_core.prompts import encode_prompt

EOS_EVERY = 13  # EOS at every position p with p % EOS_EVERY == 0
LOW_EVERY = 5  # a low-confidence prediction at every position p with p % LOW_EVERY == 0
LOW, HIGH, TAU = 0.3, 0.95, 0.5
B = 4
MAX_NEW = 10


class Script:
    def __init__(self, vocab: int, eos: int, first_free: int):
        self.vocab, self.eos, self.first_free = vocab, eos, first_free

    def token(self, p: int) -> int:
        if p % EOS_EVERY == 0:
            return self.eos
        return self.first_free + (7 * p) % (self.vocab - self.first_free)

    def conf(self, p: int) -> float:
        return LOW if p % LOW_EVERY == 0 else HIGH

    def logits(self, pos: torch.Tensor) -> torch.Tensor:
        """pos (R, K): the positions the kept columns sit at; they predict pos + 1. -> (R, K, V)"""
        target = pos + 1
        tok = torch.tensor([[self.token(int(p)) for p in row] for row in target])
        conf = torch.tensor([[self.conf(int(p)) for p in row] for row in target])
        probs = ((1 - conf) / (self.vocab - 1))[..., None].expand(*tok.shape, self.vocab).clone()
        probs.scatter_(-1, tok[..., None], conf[..., None])
        return probs.log()


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
        out.logits = script.logits(pos.gather(1, cols)).to(out.logits.dtype)
        return out

    return [model.register_forward_pre_hook(pre, with_kwargs=True),
            model.register_forward_hook(post, with_kwargs=True)]


def expected(script: Script, L: int, block: int, max_new: int = MAX_NEW, max_accept: int | None = None,
             tau: float = TAU, where=None):
    """(tokens, accepted per step) for a prompt of L tokens, with a plain loop over positions.
    `where`, a list, gets the index of the EOS inside its block (None: stopped by max_new)."""
    out, steps, p = [], [], L  # p: the position of the next token
    while True:
        n = 1
        while n < block and tau < 1 and script.conf(p + n) >= tau:
            n += 1
        if max_accept is not None:
            n = min(n, max_accept)
        block_tokens = [script.token(p + j) for j in range(n)]
        stop = block_tokens.index(script.eos) if script.eos in block_tokens else None
        take = min(n if stop is None else stop, max_new - len(out))
        out += block_tokens[:take]
        steps.append(max(take, 1))
        if stop is not None or len(out) >= max_new:
            if where is not None:
                where.append(stop)
            return out, steps
        p += n


@pytest.fixture(scope="module")
def scripted(tokenizer):
    model = make_model("qwen2", len(tokenizer))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    script = Script(len(tokenizer), tokenizer.eos_token_id, first_free=len(tokenizer.all_special_ids))
    handles = attach(model, script)
    yield model, script
    for h in handles:
        h.remove()


def _lengths(tokenizer, prompts, chat=True):
    return [len(encode_prompt(tokenizer, p, chat)) for p in prompts]


def test_the_script_exercises_eos_mid_block(tokenizer, scripted):
    """Guard: the expectation itself covers the cases the decoders must get right."""
    _, script = scripted
    where, lengths = [], []
    for L in _lengths(tokenizer, PROMPTS):
        toks, _ = expected(script, L, B, where=where)
        assert script.eos not in toks
        lengths.append(len(toks))
    assert sum(w is not None and w >= 2 for w in where) >= 2  # EOS after >= 2 accepted tokens of its block
    assert 0 in where  # EOS as the first prediction of a block
    assert MAX_NEW in lengths and len(set(lengths)) >= 3  # rows stop at different points, one at the cap


CASES = [("none", 16), ("sliding", 16), ("block", 4), ("block", 8), ("cursor", 16)]


@pytest.mark.parametrize("cache,cbs", CASES)
@pytest.mark.parametrize("mode,max_accept", [("mars", None), ("mars", 2), ("mars", 1), ("ar", None)])
def test_every_decoder_matches_the_scripted_expectation(tokenizer, scripted, cache, cbs, mode, max_accept):
    model, script = scripted
    block = B if mode == "mars" else 1
    cfg = DecodeConfig(mode=mode, tau=TAU, block_size=B, cache=cache, cache_block_size=cbs,
                       max_new_tokens=MAX_NEW, max_accept=max_accept)
    want = [expected(script, L, block, max_accept=max_accept) for L in _lengths(tokenizer, PROMPTS)]
    batch = generate(model, tokenizer, PROMPTS, cfg)
    for i, (toks, steps) in enumerate(want):
        assert batch.token_ids[i] == toks, (i, batch.token_ids[i], toks)
        assert batch.stats.per_sequence(i) == steps, i
        alone = generate(model, tokenizer, [PROMPTS[i]], cfg)  # batch 1: the decoders' single-row paths
        assert alone.token_ids[0] == toks and alone.stats.per_sequence(0) == steps, i
    assert batch.stats.tokens == sum(len(t) for t, _ in want)
    assert batch.stats.row_forwards == sum(len(s) for _, s in want)
    if max_accept is not None or mode == "ar":
        assert max(max(s) for _, s in want) <= (max_accept or 1)


@pytest.mark.parametrize("cache", ["none", "sliding", "cursor"])
def test_chat_false_encodes_the_raw_prompt(tokenizer, scripted, cache):
    model, script = scripted
    cfg = DecodeConfig(tau=TAU, block_size=B, cache=cache, max_new_tokens=MAX_NEW)
    raw = [len(tokenizer(p)["input_ids"]) for p in PROMPTS]  # no chat template
    assert raw != _lengths(tokenizer, PROMPTS)  # the template really changes the positions
    got = generate(model, tokenizer, PROMPTS, cfg, chat=False)
    assert got.token_ids == [expected(script, L, B)[0] for L in raw]
