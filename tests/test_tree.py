"""Lossless MARS with a draft tree: the layout as drawn, the path rule on scripted predictions,
the steps of a scripted model written from the rule, the key/values of an off-chain path, AR's
output and the forwards the replay counts."""
import os

import pytest
import torch

from benchmarks.tree_bound import mask_tops, replay
from conftest import PROMPTS, make_model
from mars_core import DecodeConfig, generate, load_model
from mars_core.prompts import encode_prompt, special_ids
from mars_core.tree import DraftShape, DraftTree, accept_path, chain
from scripted import Script, attach, cut
from test_bundled_models import CASES, ROOT


def test_nodes_are_depth_first_and_the_layout_is_the_drawing():
    """widths (2, 1) under groups of 2 masks, written out by hand from the rule: a node sees its
    ancestors, a group sees the path of the node it follows and its own earlier masks."""
    tree = DraftTree((2, 1), 2)
    assert tree.nodes == ((0,), (0, 0), (1,), (1, 0))
    shape = tree.shape
    assert shape.parent.tolist() == [0, 0, 1, 0, 3]
    assert shape.width == 1 + 4 + 5 * 2
    pattern, pos = shape.layout
    #             root  nodes 1-4   groups after 0, 1, 2, 3, 4
    assert pos.tolist() == [0, 1, 2, 1, 2, 1, 2, 2, 3, 3, 4, 2, 3, 3, 4]
    sees = {q: [k for k in range(shape.width) if pattern[q, k]] for q in range(shape.width)}
    assert sees[0] == [0]
    assert sees[2] == [0, 1, 2]  # node (0, 0)
    assert sees[3] == [0, 3]  # node (1,): not its sibling
    assert sees[4] == [0, 3, 4]
    assert sees[5] == [0, 5] and sees[6] == [0, 5, 6]  # the group after the root
    assert sees[9] == [0, 1, 2, 9] and sees[10] == [0, 1, 2, 9, 10]  # after node 2
    assert sees[14] == [0, 3, 4, 13, 14]  # after node 4


def test_the_accepted_path_follows_the_predictions():
    shape = DraftTree((2, 2), 2).shape  # nodes: 1 (0,), 2 (0,0), 3 (0,1), 4 (1,), 5 (1,0), 6 (1,1)
    a, b, c, d, x = 10, 11, 12, 13, 99
    tokens = torch.tensor([[a, c, d, b, c, d]] * 4)  # rank 0 / 1 at distance 1: a / b; at 2: c / d
    pred = torch.tensor([
        [a, c, x, x, x, x, x],  # root -> a, then node 1 -> c: the top-1 chain, nodes 1, 2
        [b, x, x, x, d, x, x],  # root -> b (node 4), node 4 -> d (node 6)
        [b, c, x, x, x, x, x],  # root -> b, but node 4 predicts x: one accepted
        [x, c, x, x, d, x, x],  # the root predicts neither a nor b: nothing accepted
    ])
    path, j = accept_path(shape.parent.expand(4, -1), shape.node_depth.expand(4, -1), pred, tokens, 2)
    assert j.tolist() == [2, 2, 1, 0]
    assert path[:, 0].tolist() == [1, 4, 4, 0] and path[0, 1] == 2 and path[1, 1] == 6


def test_a_padded_chain_shares_the_trees_window_and_its_leaves_see_only_the_root():
    shape = chain(3, 2).padded(5)  # nodes 1-2-3 a chain, 4 and 5 leaves under the root
    assert shape.parent.tolist() == [0, 0, 1, 2, 0, 0] and shape.node_depth.tolist() == [0, 1, 2, 3, 1, 1]
    assert shape.width == DraftTree((1, 2), 2).shape.padded(5).width == 1 + 5 + 6 * 2
    pattern, pos = shape.layout
    assert [k for k in range(6) if pattern[3, k]] == [0, 1, 2, 3] and [k for k in range(6) if pattern[5, k]] == [0, 5]
    assert pos[:6].tolist() == [0, 1, 2, 3, 1, 1]
    # a leaf repeating an accepted node's token: the path still descends from the first
    parent, depth = shape.parent.expand(2, -1), shape.node_depth.expand(2, -1)
    tokens = torch.tensor([[5, 6, 7, 5, 5], [9, 6, 7, 5, 5]])
    pred = torch.tensor([[5, 6, 7, 1, 1, 1], [5, 6, 7, 1, 1, 1]])
    path, j = accept_path(parent, depth, pred, tokens, 3)
    assert j.tolist() == [3, 1] and path.tolist() == [[1, 2, 3], [4, 0, 0]]


def runner_up(s: Script, p: int) -> int:
    return s.base(p) if s.mask(p)[0] != s.base(p) else s._other(p)


def expected_tree(s: Script, L: int, widths: tuple[int, ...], max_new: int, max_accept: int | None):
    """Per step (tokens kept, drafts accepted), from the rule: the candidates at distance i are
    the top widths[i] predictions of mask i of the group after the path's last node; a path is
    accepted while the AR token at each depth is among them."""
    out, steps, p, cands = [], [], L, []
    while True:
        j = 0
        while j < len(cands) and s.ar(p + j)[0] in cands[j]:
            j += 1
        if max_accept is not None:
            j = min(j, max_accept - 1)
        emitted = [s.ar(p + i)[0] for i in range(j + 1)]
        take, done = cut(out, emitted, s.eos, max_new)
        out += emitted[:take]
        steps.append((emitted[:take], j))
        if done:
            return steps
        after = p + j + 1
        cands = [[s.mask(after + i)[0], runner_up(s, after + i)][:w] for i, w in enumerate(widths)]
        p += j + 1


class RunnerUp(Script):
    """The script with a second mask candidate: the base token where the top one is wrong."""

    def logits(self, pos, is_mask):
        out = super().logits(pos, is_mask)
        for r in range(pos.shape[0]):
            for c in range(pos.shape[1]):
                if is_mask[r, c]:
                    out[r, c, runner_up(self, int(pos[r, c]) + 1)] = -1.0
        return out


@pytest.mark.parametrize("cache", ["cursor", "none"])
@pytest.mark.parametrize("widths, max_accept", [((2, 1, 1), None), ((2, 2), None), ((1, 2, 2), 3), ((1, 1, 1), None)])
def test_steps_of_a_scripted_model_follow_the_rule(tokenizer, cache, widths, max_accept):
    """The mask's top-1 is wrong every 7th position and its runner-up is right there; AR's token
    is wrong every 5th (a draft equal to the base sequence is rejected there)."""
    model = make_model("qwen2", len(tokenizer))
    s = RunnerUp(len(tokenizer), tokenizer.eos_token_id, len(tokenizer.all_special_ids), tokenizer.mask_token_id,
                 eos_every=29, mask_wrong=7, mask_low=None, mask_edge=None, ar_wrong=5)
    attach(model, s)
    max_new = 40
    cfg = DecodeConfig(mode="lossless", block_size=4, cache=cache, draft_tree=widths, max_new_tokens=max_new,
                       max_accept=max_accept)
    for prompt in PROMPTS[:2]:
        L = len(encode_prompt(tokenizer, prompt))
        res = generate(model, tokenizer, [prompt], cfg)
        want = expected_tree(s, L, widths, max_new, max_accept)
        assert res.token_ids[0] == [t for e, _ in want for t in e]
        assert res.stats.accepted_per_step == [[max(len(e), 1)] for e, _ in want]
        assert res.stats.accepted_drafts == sum(a for _, a in want[1:])
        assert any(a > 0 for _, a in want) and len(want) < sum(len(e) for e, _ in want)


def test_an_off_chain_path_leaves_the_cache_as_a_causal_forward_would(model):
    """After a path that is not the top-1 chain (its nodes sit apart in the window), the next
    prediction equals a plain forward of the committed text: its key/values were moved."""
    from mars_core.decode_compiled import static_state
    from mars_core.draft_plan import Plan
    from mars_core.exact_step import build_window, move_path, window_forward

    tree = DraftTree((2, 2, 1), 3)
    mask, state = model.config.vocab_size - 1, static_state(model)
    cache = state.take(1, 128, state.kv_layout(model, mask, 0))
    prompt = [5, 17, 3, 28, 9]
    nodes = tuple(40 + v for v in range(tree.size))  # node v holds token 40 + v - 1
    plan = Plan(DraftShape(tree.shape.parents, 3, tuple(range(tree.size + 1))), nodes)
    with torch.no_grad():
        first = build_window([Plan(chain(0, 3, (0,)), ())], [prompt], 0, 1, mask, 0, "cpu")
        window_forward(model, cache, first, torch.tensor([0]), 3, 128)  # the prompt: cursor 0 -> 5
        w = build_window([plan], [[7]], tree.size, tree.size + 1, mask, 0, "cpu")
        window_forward(model, cache, w, torch.tensor([5]), 3, 128)
        path = [tree.nodes.index((1,)) + 1, tree.nodes.index((1, 1)) + 1, 0]  # ranks (1,), (1, 1)
        move_path(cache, torch.tensor([5]), w, torch.tensor([path]), torch.tensor([2]))
        last = build_window([Plan(chain(0, 3, (0,)), ())], [[33]], 0, 1, mask, 0, "cpu")
        got = window_forward(model, cache, last, torch.tensor([5 + 1 + 2]), 3, 128)[0, 0]
        text = prompt + [7, 40 + path[0] - 1, 40 + path[1] - 1, 33]
        plain = model(input_ids=torch.tensor([text])).logits[0, -1]
    state.give(cache)
    torch.testing.assert_close(got, plain, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cache", ["cursor", "none"])
def test_tiny_random_models_keep_ar_output(model, tokenizer, cache):
    cfg = dict(max_new_tokens=20, block_size=4)
    ar = generate(model, tokenizer, PROMPTS, DecodeConfig(mode="ar", **cfg))
    res = generate(model, tokenizer, PROMPTS, DecodeConfig(mode="lossless", cache=cache, draft_tree=(3, 2), **cfg))
    assert res.token_ids == ar.token_ids


@pytest.fixture(scope="module")
def bundled():
    return load_model(os.path.join(ROOT, "tiny-mars-b4"), device="cpu")


@pytest.mark.parametrize("widths", [(2, 1, 1), (3, 2, 1), (1, 1, 1)])
def test_forwards_are_what_the_replay_counts(bundled, widths):
    """`benchmarks.tree_bound.replay` counts, with no decoder, the forwards a tree of these widths
    takes on the known AR output: the decoder (batched, rows leaving mid-way) takes exactly those."""
    model, tok = bundled
    prompts = [q for q, _ in CASES] + ["Tom has 12 apples. Tom has 12 apples. Tom has"]
    cfg = dict(block_size=4, max_new_tokens=96, cache="cursor")
    ar = generate(model, tok, prompts, DecodeConfig(mode="ar", **cfg))
    res = generate(model, tok, prompts, DecodeConfig(mode="lossless", draft_tree=widths, **cfg))
    assert res.token_ids == ar.token_ids
    _, _, stop_ids = special_ids(model, tok)
    off_chain = 0
    for i, p in enumerate(prompts):
        prompt = encode_prompt(tok, p)
        s = prompt + ar.token_ids[i] + ([stop_ids[0]] if len(ar.token_ids[i]) < 96 else [])
        tops = mask_tops(model, s, len(prompt) - 1, tok.mask_token_id, 4, max(widths))
        forwards = sum(1 for step in res.stats.accepted_per_step if step[i] > 0)
        assert forwards == replay(s, len(prompt) - 1, tops, widths), p
        off_chain += forwards < replay(s, len(prompt) - 1, tops, (1, 1, 1))
    assert off_chain or widths == (1, 1, 1)  # a candidate past the top-1 was accepted somewhere


@pytest.mark.parametrize("widths, n, tokens", [((2, 1, 1), 2, 10), ((2, 2, 1), 1, None), ((3, 2), 2, 4)])
def test_with_prompt_lookup_the_forwards_are_what_the_replay_counts(bundled, widths, n, tokens):
    """Rows whose text repeats draft the lookup chain, the others the tree, in one batch: the
    replay's `switch` counts the forwards, with no decoder; the output is AR's."""
    model, tok = bundled
    prompts = [q for q, _ in CASES] + ["Tom has 12 apples. Tom has 12 apples. Tom has", "the the the the"]
    cfg = dict(block_size=4, max_new_tokens=96)
    ar = generate(model, tok, prompts, DecodeConfig(mode="ar", **cfg))
    res = generate(model, tok, prompts, DecodeConfig(mode="lossless", draft_tree=widths, prompt_lookup=n,
                                                     prompt_lookup_tokens=tokens, **cfg))
    assert res.token_ids == ar.token_ids
    ref = generate(model, tok, prompts[-2:], DecodeConfig(mode="lossless", draft_tree=widths, prompt_lookup=n,
                                                          prompt_lookup_tokens=tokens, cache="none", **cfg))
    assert ref.token_ids == ar.token_ids[-2:]
    _, _, stop_ids = special_ids(model, tok)
    copied = 0
    for i, p in enumerate(prompts):
        prompt = encode_prompt(tok, p)
        s = prompt + ar.token_ids[i] + ([stop_ids[0]] if len(ar.token_ids[i]) < 96 else [])
        tops = mask_tops(model, s, len(prompt) - 1, tok.mask_token_id, 4, max(widths))
        forwards = sum(1 for step in res.stats.accepted_per_step if step[i] > 0)
        assert forwards == replay(s, len(prompt) - 1, tops, widths, switch=n, lookup_tokens=tokens), p
        copied += forwards != replay(s, len(prompt) - 1, tops, widths)
    assert copied  # the lookup chain was taken somewhere
    assert max(max(step) for step in res.stats.accepted_per_step) > 4 or not tokens  # past a block


@pytest.mark.parametrize("kw, words", [
    (dict(mode="mars"), "lossless"), (dict(temperature=0.7), "temperature"),
    (dict(draft_tree=(2, 2, 2, 2)), "block_size >= 5"),
    (dict(draft_tree=(0, 1)), ">= 1"), (dict(draft_tree=(8, 8, 2)), "nodes"), (dict(draft_tree="2,2"), "tuple"),
])
def test_bad_trees_say_what_is_allowed(kw, words):
    cfg = dict(mode="lossless", draft_tree=(2, 1))
    cfg.update(kw)
    with pytest.raises(ValueError, match=words):
        DecodeConfig(**cfg)


def test_the_context_check_counts_the_deepest_position_a_forward_may_reach():
    """The root, then B - 1 drafts, a tree's depth or lookup's chain, then a group of B - 1 masks."""
    assert DecodeConfig(mode="lossless", block_size=4).lookahead == 1 + 3 + 3
    assert DecodeConfig(mode="lossless", block_size=4, draft_tree=(2, 2, 1)).lookahead == 1 + 3 + 3
    assert DecodeConfig(mode="lossless", block_size=4, prompt_lookup=2, prompt_lookup_tokens=10).lookahead == 1 + 10 + 3
    assert DecodeConfig(mode="lossless", block_size=4, prompt_lookup=2).lookahead == 1 + 3 + 3
