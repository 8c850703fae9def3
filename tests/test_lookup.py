"""Lossless MARS with prompt-lookup drafts: AR's output, the forwards the replay counts, the rule."""
import os

import pytest
import torch

from benchmarks.tree_bound import mask_tops, replay
from mars_core import DecodeConfig, generate, load_model
from mars_core.lookup import lookup_match
from mars_core.prompts import encode_prompt, special_ids
from test_bundled_models import CASES, ROOT


def test_lookup_match_takes_the_latest_occurrence_of_the_longest_ngram():
    a, b, c, x = 1, 2, 3, 9
    assert lookup_match([a, b, c, x, a, b], 3) == (2, [c, x, a])
    assert lookup_match([a, b, c, a, b, x, a, b], 2) == (2, [x, a])  # the latest "a b"
    assert lookup_match([c, a, b, x, b], 3) == (1, [x, b])  # only "b" occurred before
    assert lookup_match([a, b, c], 3) == (0, [])
    assert lookup_match([a], 3) == (0, [])


@pytest.mark.parametrize("cache, compile", [("cursor", False), ("none", False), ("cursor", True)])
def test_lookup_drafts_keep_the_output_exactly_ar(model, tokenizer, cache, compile):
    prompts = ["the the the the the", "Tom has 12 apples. Tom has 12 apples. Tom has", "Hi"]
    cfg = dict(max_new_tokens=24, block_size=4)
    ar = generate(model, tokenizer, prompts, DecodeConfig(mode="ar", **cfg))
    for n, tokens in ((1, None), (3, None), (2, 9))[1 if compile else 0:]:  # compiled: fewer graphs to build
        res = generate(model, tokenizer, prompts, DecodeConfig(mode="lossless", cache=cache, prompt_lookup=n,
                                                               prompt_lookup_tokens=tokens, compile=compile, **cfg))
        assert res.token_ids == ar.token_ids


@pytest.fixture(scope="module")
def bundled():
    return load_model(os.path.join(ROOT, "tiny-mars-b4"), device="cpu")


@pytest.mark.parametrize("n, tokens, groups, compile", [(1, None, "all", False), (2, None, "all", False),
                                                        (2, None, "last", False), (2, 7, "last", False),
                                                        (2, 5, "all", False), (2, 7, "last", True)])
def test_forwards_are_what_the_replay_of_the_rule_counts(bundled, n, tokens, groups, compile):
    """The replay (`benchmarks.tree_bound`) applies the rule to the known AR output with no
    decoder: an oracle for which drafts each step takes and how many are accepted (the compiled
    path, `decode_compiled_lossless`, included: it drafts on the host, verifies on the device)."""
    model, tok = bundled
    # their answers end at different steps: rows leave the batch mid-way; the repeating prompts copy
    # long drafts beside rows that do not (a mixed batch still drops the masks after a copied chain)
    prompts = [q for q, _ in CASES] + ["Tom has 12 apples. Tom has 12 apples. Tom has", "the the the the"]
    cfg = dict(block_size=4, max_new_tokens=96, cache="cursor")
    ar = generate(model, tok, prompts, DecodeConfig(mode="ar", **cfg))
    res = generate(model, tok, prompts, DecodeConfig(mode="lossless", draft_groups=groups, prompt_lookup=n,
                                                     prompt_lookup_tokens=tokens, compile=compile, **cfg))
    assert res.token_ids == ar.token_ids
    _, _, stop_ids = special_ids(model, tok)
    differ = 0
    for i, p in enumerate(prompts):
        prompt = encode_prompt(tok, p)
        s = prompt + ar.token_ids[i] + ([stop_ids[0]] if len(ar.token_ids[i]) < 96 else [])
        tops = mask_tops(model, s, len(prompt) - 1, tok.mask_token_id, 4, 1)
        forwards = sum(1 for step in res.stats.accepted_per_step if step[i] > 0)
        assert forwards == replay(s, len(prompt) - 1, tops, (1, 1, 1), switch=n, lookup_tokens=tokens,
                                  groups=groups, lookup_groups=groups != "last"), p
        differ += forwards != replay(s, len(prompt) - 1, tops, (1, 1, 1), groups=groups)
    assert differ  # the lookup drafts were used on some prompt (else this test could not see them)
    longest = max(max(step) for step in res.stats.accepted_per_step)
    assert longest == (tokens or 3) + 1  # and a step took all of them (longer than a block with 7)


def test_a_step_whose_drafts_were_all_copied_carries_no_masks(bundled, monkeypatch):
    """The rule "no mask group after a copied chain", eager: every forward whose rows all copied
    their drafts feeds no [MASK], the others do, and both happen (a repeating prompt)."""
    from mars_core import draft_plan
    model, tok = bundled
    prompts = ["Tom has 12 apples. Tom has 12 apples. Tom has 12 apples. Tom has"]
    plan, state, seen = draft_plan.Planner.plan, {}, []  # seen: (all copied, masks fed) per forward

    def spy(self, *args):
        out = plan(self, *args)
        state["copied"] = out.copied
        return out

    def hook(_, args, kwargs):
        seen.append((state.pop("copied", False), bool((kwargs["input_ids"] == tok.mask_token_id).any())))
    monkeypatch.setattr(draft_plan.Planner, "plan", spy)
    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        res = generate(model, tok, prompts, DecodeConfig(mode="lossless", prompt_lookup=2, prompt_lookup_tokens=7,
                                                         max_new_tokens=48))
    finally:
        handle.remove()
    ar = generate(model, tok, prompts, DecodeConfig(mode="ar", max_new_tokens=48)).token_ids
    assert res.token_ids == ar
    assert all(copied != masks for copied, masks in seen), seen
    assert {copied for copied, _ in seen} == {True, False}
    # the reference (no cache) takes the same steps, so it meets forwards with no group too
    assert generate(model, tok, prompts, DecodeConfig(mode="lossless", cache="none", prompt_lookup=2,
                                                      prompt_lookup_tokens=7, max_new_tokens=48)).token_ids == ar


def test_compiled_lookup_builds_a_graph_without_masks(bundled, monkeypatch):
    """Compiled: the step runs without a group (no masks in its window) once every row copied,
    with the mask group otherwise, and the output stays AR's. The step is wrapped, so torch.compile
    traces it afresh and the wrapper sees each size (nodes, groups) it is compiled for."""
    from mars_core import decode_shaped
    model, tok = bundled
    step, traced = decode_shaped.window_step, set()

    def wrapped(*args, **kw):
        traced.add((args[2].tokens.shape[1], args[2].group_node.shape[1]))  # (nodes, groups)
        return step(*args, **kw)
    monkeypatch.setattr(decode_shaped, "window_step", wrapped)
    prompts = ["Tom has 12 apples. Tom has 12 apples. Tom has 12 apples. Tom has"]
    res = generate(model, tok, prompts, DecodeConfig(mode="lossless", prompt_lookup=2, prompt_lookup_tokens=7,
                                                     max_new_tokens=48, compile=True))
    assert res.token_ids == generate(model, tok, prompts, DecodeConfig(mode="ar", max_new_tokens=48)).token_ids
    assert (7, 0) in traced and (3, 1) in traced, traced


def test_the_planner_drops_the_masks_after_a_copied_chain():
    """`Planner`, the one place a step's drafts are chosen, against the rule written out: a row
    whose text repeats drafts what followed (with "last", no group after it); a row that copied
    has no mask drafts next step; a row that did not keeps its masks' top-1 chain and its group."""
    from mars_core.draft_plan import Candidates, Planner
    planner = Planner(DecodeConfig(mode="lossless", prompt_lookup=2, prompt_lookup_tokens=5))
    masks = Candidates(((50,), (51,), (52,)), ((0.9,), (0.8,), (0.7,)))
    copied = planner.plan(masks, [1, 2, 3, 1, 2, 3], False)  # (1, 2, 3) occurred at 0: 1, 2, 3 followed
    assert copied.tokens == (1, 2, 3) and copied.copied and copied.shape.group_nodes == ()
    plain = planner.plan(masks, [7, 8, 9, 10], False)
    assert plain.tokens == (50, 51, 52) and not plain.copied and plain.shape.group_nodes == (3,)
    after = planner.plan(masks, [1, 2, 3, 1, 2, 3, 1, 2, 3, 99], True)  # no match; the last drafts were copied
    assert after.tokens == () and after.shape.group_nodes == (0,)
    kept = Planner(DecodeConfig(mode="lossless", prompt_lookup=2, draft_groups="all"))  # "all" keeps them
    assert kept.plan(masks, [1, 2, 3, 1, 2, 3, 1, 2, 3, 99], True).tokens == (50, 51, 52)
    assert kept.plan(masks, [1, 2, 3, 1, 2, 3], False).shape.group_nodes == (0, 1, 2, 3)


def test_prompt_lookup_is_refused_where_it_does_not_run():
    for bad in (dict(mode="mars"), dict(mode="lossless", temperature=0.7), dict(mode="lossless", prompt_lookup=4)):
        with pytest.raises(ValueError, match="prompt_lookup"):
            DecodeConfig(**{"prompt_lookup": 2, **bad})
    with pytest.raises(ValueError, match="prompt_lookup must be >= 0"):
        DecodeConfig(mode="lossless", prompt_lookup=-1)
    for bad in (dict(prompt_lookup_tokens=7), dict(prompt_lookup=2, prompt_lookup_tokens=0),
                dict(prompt_lookup=2, prompt_lookup_tokens=33)):
        with pytest.raises(ValueError, match="prompt_lookup_tokens"):
            DecodeConfig(mode="lossless", **bad)
