"""benchmarks.tree_bound: mask predictions of the one-forward layout against plain MARS forwards,
the replay against hand-counted steps and against a real lossless decode."""
import json
import os

import pytest
import torch

from benchmarks.tree_bound import mask_logits, mask_tops, nodes, parse_trees, replay
from mars_core import DecodeConfig, load_model
from mars_core.generate import generate
from mars_core.lookup import lookup_match
from mars_core.prompts import encode_prompt, special_ids
from test_bundled_models import CASES, ROOT


def test_mask_logits_equal_a_plain_mars_forward_after_every_prefix(model, tokenizer):
    s = [5, 17, 40, 8, 99, 23, 61, 7, 12]
    first, B = 3, 4
    mask_id = tokenizer.mask_token_id
    got = mask_logits(model, s, first, mask_id, B)  # (L - first, B - 1, V)
    assert got.shape == (len(s) - first, B - 1, len(tokenizer))
    for t in range(first, len(s)):
        with torch.no_grad():
            want = model(input_ids=torch.tensor([s[: t + 1] + [mask_id] * (B - 1)])).logits[0, t + 1:]
        torch.testing.assert_close(got[t - first], want, rtol=1e-4, atol=1e-5)
    tops = mask_tops(model, s, first, mask_id, B, 3)
    assert torch.equal(tops, got.topk(3, dim=-1).indices)


def _tops(rows):
    """Scripted M_t: rows[g][m] = candidate ids of mask m after s[:first + g + 1]."""
    return torch.tensor(rows)


def test_replay_counts_steps_as_the_rule_says():
    s = [1, 2, 10, 11, 12, 13, 14, 15, 16]  # prompt [1, 2]: first = 1; 7 tokens to emit
    X = 0  # never right
    tops = _tops([[[11, X], [12, X], [X, 13]],   # after s[:2] (=...2): drafts for 11, 12, 13
                  [[X, X], [X, X], [X, X]],      # after 10
                  [[X, X], [X, X], [X, X]],      # after 11
                  [[X, X], [X, X], [X, X]],      # after 12
                  [[X, 15], [16, X], [X, X]],    # after 13: drafts for 15, 16
                  [[X, X], [X, X], [X, X]],
                  [[X, X], [X, X], [X, X]],
                  [[X, X], [X, X], [X, X]]])
    # top-1: forward 1 emits 10 (no drafts); forward 2 accepts 11, 12 (13 is not top-1), emits 13;
    # drafts after 12 are all wrong: forward 3 emits 14; after 13 the drafts 15 (2nd only): forward 4 emits 15;
    # forward 5 emits 16
    assert replay(s, 1, tops, (1, 1, 1)) == 5
    # width 2 at distance 3 also takes 13: forward 2 emits 11 12 13 and 14 (the AR token); the drafts
    # after 13 (15 2nd only) fail: forward 3 emits 15, forward 4 16
    assert replay(s, 1, tops, (1, 1, 2)) == 4
    assert replay(s, 1, tops, (2, 2, 2)) == 3  # and forward 3 takes 15 (2nd) and 16
    assert replay(s, 1, tops, (1, 1)) == 5  # two drafts: 10; 11 12 and 13 as the AR token; 14; 15; 16
    perfect = torch.tensor([[[s[t + 1 + m] if t + 1 + m < len(s) else 0] for m in range(1, 4)]
                            for t in range(1, len(s))])
    assert replay(s, 1, perfect, (1, 1, 1)) == 1 + 2  # 10, then 4 and 2 tokens a forward
    wrong = torch.zeros(len(s) - 1, 3, 1, dtype=torch.long)
    assert replay(s, 1, wrong, (1, 1, 1)) == 7
    assert replay(s + [0], 1, torch.cat([wrong, wrong[:1]]), (1, 1, 1), lookup=False) == 8


def test_replay_width_and_lookup_accept_what_top1_misses():
    s = [1, 2, 10, 11, 12, 13]
    X = 0
    tops = _tops([[[X, 11], [12, X], [13, X]]] + [[[X, X], [X, X], [X, X]]] * 4)
    assert replay(s, 1, tops, (1, 1, 1)) == 4  # 10, 11, 12, 13 one by one
    assert replay(s, 1, tops, (2, 1, 1)) == 2  # 10; then 11 (2nd), 12, 13 accepted
    repeat = [1, 7, 8, 9, 4, 7, 8, 9, 4, 7]  # prompt [1]: the text repeats 7 8 9 4
    wrong = torch.zeros(len(repeat) - 1, 3, 1, dtype=torch.long)
    assert replay(repeat, 0, wrong, (1, 1, 1)) == 9
    # lookup: 7 8 9 4 one by one (no earlier match until 7 repeats), then 8 9 4 after the match of 7, then 7
    assert replay(repeat, 0, wrong, (1, 1, 1), lookup=True) == 6


def test_lookup_draft_takes_the_latest_earlier_match_of_the_longest_ngram():
    assert lookup_match([5, 1, 2, 3, 9, 1, 2, 4, 8, 1, 2], 3)[1] == [4, 8, 1]  # latest "1 2"
    assert lookup_match([5, 1, 2, 3, 7, 2, 6, 1, 2], 2)[1] == [3, 7]  # "1 2" beats the later "2"
    assert lookup_match([1, 2, 3], 3)[1] == []
    assert lookup_match([4, 4], 3)[1] == [4]


def test_nodes_and_tree_parsing():
    assert nodes((1, 1, 1)) == 3 and nodes((2, 1, 1)) == 6 and nodes((3, 2, 1)) == 3 + 6 + 6
    assert parse_trees("1,1,1 2,1") == [(1, 1, 1), (2, 1)]
    with pytest.raises(ValueError, match="widths"):
        parse_trees("2,0,1")


@pytest.fixture(scope="module")
def bundled_mars():
    return load_model(os.path.join(ROOT, "tiny-mars-b4"), device="cpu")


def test_replay_of_top1_drafts_counts_the_forwards_of_a_real_lossless_decode(bundled_mars):
    """The bundled MARS model's drafts are good (several tokens a forward), so a replay that reads
    the wrong group or accepts by another rule counts other forwards than the decoder."""
    model, tok = bundled_mars
    prompts = [q for q, _ in CASES[:4]]
    cfg = dict(block_size=4, max_new_tokens=64, cache="cursor")
    ar = generate(model, tok, prompts, DecodeConfig(mode="ar", **cfg))
    ll = generate(model, tok, prompts, DecodeConfig(mode="lossless", draft_groups="all", **cfg))
    assert ll.token_ids == ar.token_ids and ll.stats.tokens_per_forward > 2
    _, _, stop_ids = special_ids(model, tok)
    for i, p in enumerate(prompts):
        prompt = encode_prompt(tok, p)
        stopped = len(ar.token_ids[i]) < cfg["max_new_tokens"]
        s = prompt + ar.token_ids[i] + ([stop_ids[0]] if stopped else [])
        tops = mask_tops(model, s, len(prompt) - 1, tok.mask_token_id, 4, 1)
        forwards = sum(1 for step in ll.stats.accepted_per_step if step[i] > 0)
        assert replay(s, len(prompt) - 1, tops, (1, 1, 1)) == forwards, p


def test_the_command_replays_a_real_eval_run_resumably_and_prints_its_table(tmp_path, capsys):
    from benchmarks import real_eval, tree_bound

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": q}) + "\n" for i, (q, _) in enumerate(CASES[:3])))
    model = os.path.join(ROOT, "tiny-mars-b4")
    assert real_eval.main(["--model", model, "--prompts", str(prompts), "--out", str(tmp_path / "r"), "--taus", "",
                           "--max-new-tokens", "24"]) == 0
    args = ["--model", model, "--run", str(tmp_path / "r"), "--prompts", str(prompts), "--out", str(tmp_path / "t.jsonl"),
            "--trees", "1,1,1 2,1,1"]
    assert tree_bound.main(args) == 0 and tree_bound.main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(rows) == 3  # nothing replayed twice
    assert all(r["1,1,1"] == r["measured_lossless"] for r in rows)
    assert all(r["2,1,1"] <= r["1,1,1"] and r["1,1,1+lookup"] <= r["1,1,1"] for r in rows)
    capsys.readouterr()
    assert tree_bound.main(["--out", str(tmp_path / "t.jsonl"), "--table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| lossless as decoded |") and any("prompt lookup alone (3)" in x for x in lines)
    assert tree_bound.main(["--out", str(tmp_path / "t.jsonl")]) == 2  # no run: one line, no traceback
    assert capsys.readouterr().out.startswith("error: ")
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": 0, "prompt": "something else entirely, and longer"}) + "\n")
    assert tree_bound.main([*args[:4], "--prompts", str(other), "--out", str(tmp_path / "u.jsonl")]) == 2
    said = capsys.readouterr().out  # prompts 1 and 2 are missing, prompt 0 is another text
    assert said.startswith("error: prompt ") and "the prompt file given" in said


def test_switch_takes_lookup_drafts_only_where_a_long_enough_ngram_matched():
    repeat = [1, 7, 8, 9, 4, 7, 8, 9, 4, 7]  # prompt [1]
    wrong = torch.zeros(len(repeat) - 1, 3, 1, dtype=torch.long)
    assert replay(repeat, 0, wrong, (1, 1, 1)) == 9
    # switch 1: at "...4 7" the 1-gram 7 occurred before: lookup drafts 8 9 4, all accepted, 7 the AR token
    assert replay(repeat, 0, wrong, (1, 1, 1), switch=1) == 6
    # switch 2: the masks draft (wrongly) until "7 8" (a 2-gram seen before): lookup 9 4 7
    assert replay(repeat, 0, wrong, (1, 1, 1), switch=2) == 7
    # switch 3: until "7 8 9": lookup 4 7
    assert replay(repeat, 0, wrong, (1, 1, 1), switch=3) == 8
    good = wrong.clone()
    good[4, :, 0] = torch.tensor([8, 9, 4])  # the masks after "...9 4" are right
    assert replay(repeat, 0, good, (1, 1, 1)) == 6
    assert replay(repeat, 0, good, (1, 1, 1), switch=3) == 6  # no 3-gram has matched there: masks draft


def test_lookup_replay_reads_the_cost_curve_and_refuses_a_missing_one(tmp_path, capsys):
    from benchmarks.lookup_replay import cost_curve, main

    path = tmp_path / "ceiling.json"
    path.write_text(json.dumps({"seconds": {"1": {"1": 0.1, "2": 0.12, "8": 0.2}}}))
    cost = cost_curve(str(path))
    assert (cost(1), cost(2), cost(5), cost(8)) == (1.0, pytest.approx(1.2), pytest.approx(1.6), pytest.approx(2.0))
    assert main(["--run", str(tmp_path), "--prompts", str(path), "--ceiling", str(tmp_path / "none.json")]) == 2
    assert "error:" in capsys.readouterr().out
