"""Benchmark rows for exact multi-token decoding: lossless MARS, speculative decoding, HF assisted.

Imported by the CLI (bench.py) so that these `register` calls run before it parses arguments.
All run on the MARS model (the target); the spec rows and `hf-assisted` draft with
`--draft-model` (default: the bundled small draft `tiny-draft`, which shares the tokenizer),
`--draft-tokens` K tokens per step, decoding AR or (`--draft-block-size` > 1, a MARS draft) with
MARS. Their `= ref` compares with `hf-generate-mars`, `model.generate` of the MARS model (greedy
AR): lossless, spec and spec-mars at tau 1 must be 100%. T/F counts target forwards only; the
draft's forwards are extra work (see `calls`, target only).
"""
from __future__ import annotations

import copy

import torch

from mars_core.config import MAX_DRAFT_TOKENS, DecodeConfig
from mars_core.fastest import fastest_exact
from mars_core.generate import decode_steps
from mars_core.loading import load_model
from mars_core.prompts import special_ids

from .methods import Method, _hf_batch, register, run_hf

_DRAFTS: dict = {}


def draft_model(args):
    """The draft model of --draft-model, loaded once per process (outside the timed runs: the
    warm-up calls this first)."""
    key = (args.draft_model, args.device, args.dtype, getattr(args, "prepack", False))
    if key not in _DRAFTS:
        _DRAFTS[key] = load_model(args.draft_model, device=args.device, dtype=getattr(torch, args.dtype),
                                  prepack=getattr(args, "prepack", False))[0]
    return _DRAFTS[key]


def _decode(model, tok, ids, cfg: DecodeConfig, draft=None, counter=None):
    rows, steps = decode_steps(model, tok, ids, cfg, draft_model=draft)
    for _ in steps:
        pass
    if counter is not None:  # a compiled graph runs no forward hook: count its steps as `run_ours` does
        counter.add(rows.stats.forwards + rows.stats.prefill_forwards)
    return rows.out, rows.stats.row_forwards


def run_lossless(method: Method, model, tok, ids, tau, args, counter):
    # the lookup row drafts as many tokens as hf-prompt-lookup may (--prompt-lookup-tokens), a like-for-like pair
    lookup = dict(prompt_lookup=2, prompt_lookup_tokens=min(args.prompt_lookup_tokens, MAX_DRAFT_TOKENS)) \
        if "lookup" in method.name else {}
    if method.name.startswith("mars-lossless-tree"):
        lookup = dict(draft_tree=tuple(args.draft_tree), **lookup)
    if method.name.startswith("mars-lossless-budget"):
        lookup = dict(draft_budget=tuple(args.draft_budget), **lookup)
    cfg = DecodeConfig(mode="lossless", block_size=args.block_size, cache="cursor", max_new_tokens=args.max_new_tokens,
                       compile=method.compile, **lookup)
    return _decode(model, tok, ids, cfg, counter=counter if method.compile else None)


def run_fastest(method: Method, model, tok, ids, tau, args, counter):
    """`fastest_exact`'s configuration for this machine and batch size, chosen on its own sample
    prompts (not the benchmark's) the first time (in the warm-up: untimed), then compiled."""
    key = ("config", len(ids))
    if key not in method.state:
        report = {}
        method.state[key] = fastest_exact(model, tok, block_size=args.block_size, batch_size=len(ids),
                                          max_new_tokens=args.max_new_tokens, compile=True, report=report)
        method.state.setdefault("reports", {})[len(ids)] = report
        best = max(report["candidates"], key=lambda c: c["speedup"])
        method.state.setdefault("notes", []).append(
            f"fastest-exact at batch {len(ids)} chose {best['config']}"
            f"{'' if method.state[key].mode == 'ar' else ' with prompt lookup'} (modelled "
            f"{best['speedup']:.2f}x AR at {best['tokens_per_forward']:.2f} tokens per forward on its sample prompts)")
    cfg = method.state[key]
    return _decode(model, tok, ids, cfg, counter=counter)


def _fastest_note(args) -> str | None:
    return ("fastest-exact: `mars_core.fastest_exact`'s choice, per batch size, from this machine's forward costs "
            "and a replay of each candidate on its own sample prompts (chosen in the warm-up, untimed)")


def run_spec(method: Method, model, tok, ids, tau, args, counter):
    """Standard speculative decoding (target block 1: no mask groups), or with the MARS target's
    groups at `tau` (spec-mars)."""
    mars = method.name == "spec-mars"
    cfg = DecodeConfig(mode="spec", block_size=args.block_size if mars else 1, tau=tau if mars else 1.0,
                       metric=args.metric, draft_tokens=args.draft_tokens, cache="cursor",
                       draft_block_size=args.draft_block_size, max_new_tokens=args.max_new_tokens)
    return _decode(model, tok, ids, cfg, draft_model(args))


def run_hf_assisted(method: Method, model, tok, ids, tau, args, counter):
    """`model.generate(assistant_model=draft)`, K drafts per step (constant schedule, no early
    stop on the draft's confidence, as ours); HF runs it at batch 1 only: prompt by prompt."""
    draft = draft_model(args)
    if "draft" not in method.state:
        draft = copy.copy(draft)
        draft.generation_config = copy.deepcopy(draft.generation_config)
        draft.generation_config.num_assistant_tokens = args.draft_tokens
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
        method.state["draft"] = draft
    _, pad_id, stop = special_ids(model, tok)
    tokens, row_forwards = [], 0
    for seq in ids:
        before = counter.n
        got, _ = _hf_batch(model, [seq], pad_id, stop, args.max_new_tokens, assistant_model=method.state["draft"])
        tokens += got
        row_forwards += counter.n - before
    return tokens, row_forwards


def _assisted_note(args) -> str | None:
    if max(args.batch_sizes) > 1:
        return "hf-assisted: HF assisted generation supports batch size 1 only; at batch > 1 the prompts are decoded one after the other."
    return None


register(Method("hf-generate-mars", "mars", run_hf, reference=True,
                help="`model.generate(do_sample=False)` of the MARS model: the AR output the\n"
                     "exact rows (mars-lossless, spec, spec-mars at tau 1) must reproduce"))
register(Method("mars-lossless", "mars", run_lossless, "cursor", exact=True,
                help="lossless MARS: the model's mask predictions are drafts its next forward\n"
                     "verifies (cursor cache); token for token AR"))
register(Method("mars-lossless-lookup", "mars", run_lossless, "cursor", exact=True,
                help="lossless MARS drafting by prompt lookup where the text's last 2-gram occurred\n"
                     "before (up to --prompt-lookup-tokens), by its masks elsewhere (`prompt_lookup=2`);\n"
                     "token for token AR"))
register(Method("mars-lossless-tree", "mars", run_lossless, "cursor", exact=True,
                help="lossless MARS drafting a tree, the top-k mask candidates per distance (--draft-tree,\n"
                     "default 2,1,1), a group of masks after every node; token for token AR"))
register(Method("mars-lossless-tree-lookup", "mars", run_lossless, "cursor", exact=True,
                help="mars-lossless-tree where the text does not repeat, the prompt-lookup chain of\n"
                     "mars-lossless-lookup where it does; token for token AR"))
register(Method("mars-lossless-compiled", "mars", run_lossless, "cursor", exact=True, warm_every_chunk=True,
                compile=True, help="lossless MARS on the static-shape cursor cache under `torch.compile`\n"
                                   "(greedy; `compile=True`); token for token AR"))
register(Method("mars-lossless-lookup-compiled", "mars", run_lossless, "cursor", exact=True, warm_every_chunk=True,
                compile=True, help="mars-lossless-lookup under `torch.compile` (the drafts are chosen on the host\n"
                                   "after each step's one sync); token for token AR"))
register(Method("mars-lossless-tree-compiled", "mars", run_lossless, "cursor", exact=True, warm_every_chunk=True,
                compile=True, help="mars-lossless-tree under `torch.compile`; token for token AR"))
register(Method("mars-lossless-budget", "mars", run_lossless, "cursor", exact=True,
                help="lossless MARS drafting per step the --draft-budget nodes its masks' joint probabilities\n"
                     "make likeliest, groups after the likeliest ends (`draft_budget`); token for token AR"))
register(Method("mars-lossless-budget-lookup-compiled", "mars", run_lossless, "cursor", exact=True,
                warm_every_chunk=True, compile=True,
                help="mars-lossless-budget with prompt-lookup drafts among the candidates, under `torch.compile`"))
register(Method("fastest-exact", "mars", run_fastest, "cursor", exact=True, warm_every_chunk=True, compile=True,
                note=_fastest_note, help="`mars_core.fastest_exact(model, tokenizer)`: the exact configuration with the\n"
                                         "best modelled speed on this machine, compiled; token for token AR"))
register(Method("spec", "mars", run_spec, "cursor", exact=True,
                help="speculative decoding: --draft-model proposes --draft-tokens, the MARS\n"
                     "model verifies as an AR model (cursor caches); token for token AR"))
register(Method("spec-mars", "mars", run_spec, "cursor", uses_tau=True, exact=True,
                help="the paper's 4.6: spec, and after the accepted drafts the target's own\n"
                     "block by the tau rule; exact at tau 1 only"))
register(Method("hf-assisted", "mars", run_hf_assisted, optional=True, exact=True, note=_assisted_note,
                help="`model.generate(assistant_model=draft)`, HF's speculative decoding with\n"
                     "the same draft and K; batch 1 only, so a batch is decoded prompt by prompt"))
