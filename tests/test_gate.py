"""The mask gate: real positions compute the base bit for bit; the gated layout; the gated stage."""
import json
import os

import pytest
import torch

from mars_core import DecodeConfig, generate
from mars_core.gate import EMBEDDING, attach_gate, gate_state, load_gate, read_gate, save_gate, wrapped_layers
from test_frozen_layers import _distill_file, tiny_llama, tiny_model_dir  # noqa: F401 (fixture)
from test_packaged import tiny_registry  # noqa: F401 (fixture)
from training.gated_layout import anchors, group_layout, with_targets
from training.gated_stage import batch_at, steps_per_epoch

MASK = 5


def _randomise(params, seed=1, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def test_real_positions_are_the_base_bit_for_bit_and_masks_are_not():
    base, gated = tiny_llama(), tiny_llama()
    _randomise(attach_gate(gated, MASK, rank=4, trainable=True))
    ids = torch.tensor([[7, 9, 11, MASK, MASK, 13, 8, MASK, 21], [MASK, 30, 31, 32, 33, MASK, MASK, 40, 41]])
    with torch.no_grad():
        want, got = base(ids).logits, gated(ids).logits
    real = ids != MASK
    # exact only where nothing before a real token was a mask: here every real token after a mask
    # attends it, so compare a causal-prefix-clean batch too
    prefix_clean = torch.cumsum(~real, dim=1) == 0
    assert torch.equal(got[prefix_clean], want[prefix_clean])
    assert (got[~real] - want[~real]).abs().amax() > 1e-3  # the adapters act where the input is the mask


def test_a_forward_without_masks_is_the_base_and_runs_no_adapter(monkeypatch):
    """An AR step of a gated model costs the base's forward: the adapters are not run at all
    (not run and selected away), and the logits are the base's bit for bit."""
    from mars_core.gate import GatedLinear

    base, gated = tiny_llama(), tiny_llama()
    _randomise(attach_gate(gated, MASK, rank=4, trainable=True))
    calls = []
    real = GatedLinear.delta
    monkeypatch.setattr(GatedLinear, "delta", lambda self, x: calls.append(1) or real(self, x))
    ids = torch.tensor([[7, 9, 11, 13], [8, 10, 12, 14]])
    with torch.no_grad():
        assert torch.equal(gated(ids).logits, base(ids).logits)
        assert calls == []
        gated(torch.tensor([[7, 9, 11, MASK], [8, 10, 12, 14]]))  # one mask anywhere in the batch: the adapters run
    assert len(calls) > 0


def _graph_ops(model, ids, promise):
    """(logits, adapter matmuls in the graph) of `model(ids)` traced by dynamo in one graph, inside
    `promise`: the adapters are `x @ A.T @ B.T` (operator.matmul), the base's layers F.linear."""
    import operator

    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    run = torch.compile(lambda x: model(input_ids=x).logits, backend=backend, fullgraph=True)
    with torch.no_grad(), promise:
        out = run(ids)
    return out, sum(n.target in (operator.matmul, torch.matmul) for g in graphs for n in g.graph.nodes)


def test_a_compiled_forward_promised_no_masks_is_the_base_graph(monkeypatch):
    """A compiled graph cannot branch on the ids, so it computes every adapter and selects them away;
    inside `no_masks` (what a compiled AR decode enters per forward) it holds the base's layers alone."""
    import contextlib

    from mars_core.gate import no_masks

    base, gated = tiny_llama(), tiny_llama()
    _randomise(attach_gate(gated, MASK, rank=4, trainable=True))
    ids = torch.tensor([[7, 9, 11, 13]])
    with torch.no_grad():
        want = base(ids).logits
    out, adapters = _graph_ops(gated, ids, contextlib.nullcontext())
    assert torch.equal(out, want) and adapters > 0  # selected away, still computed
    out, adapters = _graph_ops(gated, ids, no_masks(gated))
    assert torch.equal(out, want) and adapters == 0
    with pytest.raises(ValueError, match="promised no mask"):  # eagerly the promise is checked
        with torch.no_grad(), no_masks(gated):
            gated(torch.tensor([[7, MASK]]))


def test_a_compiled_ar_decode_promises_no_masks_and_mars_does_not(tokenizer, monkeypatch):
    """`decode_compiled` enters `no_masks` for every forward of an AR decode (B = 1), never for MARS."""
    from conftest import make_model
    from mars_core import decode_compiled as dc

    model = make_model("llama", len(tokenizer))
    from mars_core.prompts import special_ids

    attach_gate(model, special_ids(model, tokenizer)[0], rank=2)
    gate = model.mars_gate
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append(gate.known))
    monkeypatch.setattr(dc, "compiled", lambda fn, mode: fn)  # the static path, run eagerly
    prompts = ["hello there", "the cat"]
    for mode, want in (("ar", False), ("mars", None)):
        seen.clear()
        generate(model, tokenizer, prompts, DecodeConfig(mode=mode, cache="cursor", compile=True, max_new_tokens=6))
        assert seen[1:] and set(seen[1:]) == {want}  # the first forward reads the cache layout, eagerly


def test_a_window_of_text_then_masks_leaves_every_text_position_exact_and_ar_is_the_base(tokenizer):
    from conftest import make_model

    base = make_model("llama", len(tokenizer))
    gated = make_model("llama", len(tokenizer))
    mask_id = tokenizer.mask_token_id
    _randomise(attach_gate(gated, mask_id, rank=4, trainable=True), scale=0.5)
    text = tokenizer(["Tom has 12 apples and buys 30 more."], return_tensors="pt")["input_ids"]
    window = torch.cat([text, torch.full((1, 3), mask_id)], dim=1)
    with torch.no_grad():
        assert torch.equal(gated(window).logits[:, :text.shape[1]], base(window).logits[:, :text.shape[1]])
    cfg = DecodeConfig(mode="ar", max_new_tokens=24, cache="cursor")
    prompts = ["Tom has 12 apples.", "What is 24 * 3?"]
    assert generate(gated, tokenizer, prompts, cfg).token_ids == generate(base, tokenizer, prompts, cfg).token_ids


def test_lossless_mars_on_a_gated_model_gives_the_base_greedy_output(tokenizer):
    from conftest import make_model

    base = make_model("llama", len(tokenizer))
    gated = make_model("llama", len(tokenizer))
    _randomise(attach_gate(gated, tokenizer.mask_token_id, rank=4, trainable=True), scale=0.5)
    prompts = ["Tom has 12 apples.", "Sort the list 45, 12, 88, 31, 7, 19, 23 and then tell me the sum.", "Hi"]
    ar = generate(base, tokenizer, prompts, DecodeConfig(mode="ar", max_new_tokens=30, cache="cursor")).token_ids
    for cfg in (DecodeConfig(mode="lossless", block_size=4, max_new_tokens=30),
                DecodeConfig(mode="lossless", block_size=4, max_new_tokens=30, draft_tree=(2, 1, 1)),
                DecodeConfig(mode="mars", tau=1.0, block_size=4, max_new_tokens=30, cache="cursor")):
        assert generate(gated, tokenizer, prompts, cfg).token_ids == ar, cfg


def test_inputs_embeds_are_refused_and_a_second_gate_too():
    model = tiny_llama()
    attach_gate(model, MASK, rank=2)
    with pytest.raises(ValueError, match="input_ids"):
        model(inputs_embeds=torch.zeros(1, 3, 32))
    with pytest.raises(ValueError, match="already"):
        attach_gate(model, MASK, rank=2)


def test_only_the_top_layers_are_wrapped_and_the_stored_gate_round_trips(tmp_path):
    model = tiny_llama()
    params = attach_gate(model, MASK, rank=3, layers=2, trainable=True)
    assert {int(k.split(".")[2]) for k in wrapped_layers(model)} == {2, 3}
    assert len(params) == 2 * 7 * 2 + 1  # A and B of 7 matrices in 2 layers, and the mask embedding
    _randomise(params)
    save_gate(model, str(tmp_path / "gate.safetensors"), dtype=torch.float32)
    state, mask_id = read_gate(str(tmp_path / "gate.safetensors"))
    assert mask_id == MASK and state[EMBEDDING].shape == (32,)
    other = tiny_llama()
    load_gate(other, str(tmp_path / "gate.safetensors"))
    ids = torch.tensor([[7, 9, MASK, MASK, MASK]])
    with torch.no_grad():
        got, want = other(ids).logits, model(ids).logits
    # a loaded gate stacks sibling adapters (`fuse_siblings`): the masks' rounding may differ
    assert torch.equal(got[:, :2], want[:, :2]) and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    for k, v in gate_state(other).items():
        assert torch.equal(v, state[k]), k



def test_a_half_precision_cpu_model_computes_its_stored_gate_in_fp32_and_its_real_positions_stay_the_base(tmp_path):
    """A bf16 matmul of a few rows by the rank costs ~5x an fp32 one on a CPU (oneDNN's per-call
    set-up), so an installed gate computes B @ A x in fp32 there and adds it in the layer's dtype;
    real positions are still the bf16 base's, bit for bit."""
    model = tiny_llama()
    _randomise(attach_gate(model, MASK, rank=3, trainable=True))
    save_gate(model, str(tmp_path / "gate.safetensors"), dtype=torch.float32)
    base, gated = tiny_llama().to(torch.bfloat16), tiny_llama().to(torch.bfloat16)
    load_gate(gated, str(tmp_path / "gate.safetensors"))
    layer = gated.model.layers[1].mlp.up_proj
    x = torch.randn(1, 6, 32).to(torch.bfloat16)
    on = torch.tensor([[False, False, True, True, False, True]])
    gated.mars_gate.on = on
    with torch.no_grad():
        got = layer(x)
        plain = layer.base(x)
        want = plain + ((x.float() @ layer.lora_a.float().T) @ layer.lora_b.float().T).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got[~on], plain[~on]) and torch.equal(got[on], want[on])
    ids = torch.tensor([[7, 9, 11, 13, MASK, MASK]])
    with torch.no_grad():
        assert torch.equal(gated(ids).logits[:, :4], base(ids).logits[:, :4])

@pytest.mark.parametrize("block_size,max_distance", [(4, None), (3, None), (4, 3)])
def test_each_group_predicts_what_a_plain_forward_of_prefix_and_masks_predicts(block_size, max_distance):
    model = tiny_llama()
    _randomise(attach_gate(model, MASK, rank=3, trainable=True))
    g0 = torch.Generator().manual_seed(3)
    ids = torch.randint(6, 64, (17,), generator=g0)
    n, start = len(ids), 6
    anchor = torch.tensor([start - 1, 9, n - 3])
    g = with_targets(group_layout(anchor, n, block_size, MASK, max_distance), ids)
    with torch.no_grad():
        clean = model.model(input_ids=ids[None], use_cache=True)
        h = model.model(input_ids=g.ids, position_ids=g.pos, attention_mask=g.mask,
                        cache=clean.past_key_values).last_hidden_state
        got = model.lm_head(h[0])
    top = block_size if max_distance is None else min(block_size, max_distance)
    row = 0
    for p in anchor.tolist():
        count = min(top - 1, n - 2 - p)  # masks whose target lies inside the text
        plain = torch.cat([ids[:p + 1], torch.full((top - 1,), MASK)])[None]
        with torch.no_grad():
            want = model(plain).logits[0, p + 1:p + 1 + count]
        torch.testing.assert_close(got[row:row + count], want, rtol=1e-4, atol=1e-4)
        for j in range(1, count + 1):  # from the rule: mask j after p predicts x[p + j + 1], distance j + 1
            assert g.targets[row + j - 1] == ids[p + j + 1] and g.distance[row + j - 1] == j + 1
            assert g.source[row + j - 1] == p + j
        row += count
    assert row == g.ids.shape[1]


def test_far_keep_ends_groups_early_at_the_documented_rate_and_each_stays_a_decoding_window():
    n, B = 20, 4
    many = torch.full((4000,), 5)
    g = group_layout(many, n, B, MASK, far_keep=0.5, generator=torch.Generator().manual_seed(0))
    counts = [(g.distance == d).sum().item() for d in (2, 3, 4)]
    assert counts[0] == 4000 and abs(counts[1] - 2000) < 120 and abs(counts[2] - 1000) < 90  # 0.5, 0.5 ** 2
    starts = (g.distance == 2).nonzero()[:, 0].tolist() + [len(g.distance)]
    for a, b in zip(starts, starts[1:]):  # each group: distances 2, 3, .. with none skipped
        assert g.distance[a:b].tolist() == list(range(2, 2 + b - a))
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    whole = group_layout(many[:3], n, B, MASK, far_keep=1.0, generator=gen)
    assert torch.equal(gen.get_state(), state) and len(whole.distance) == 9  # 1: nothing drawn, all kept
    # truncated groups still compute what a plain forward of the prefix and that group's masks does
    model = tiny_llama()
    _randomise(attach_gate(model, MASK, rank=3, trainable=True))
    ids = torch.randint(6, 64, (n,), generator=torch.Generator().manual_seed(3))
    anchor = torch.tensor([5, 8, 11, 14])
    g = with_targets(group_layout(anchor, n, B, MASK, far_keep=0.5, generator=torch.Generator().manual_seed(0)), ids)
    assert sorted(set(g.distance.tolist())) == [2, 3, 4] and len(g.distance) < 12  # the seed gives mixed lengths
    with torch.no_grad():
        clean = model.model(input_ids=ids[None], use_cache=True)
        h = model.model(input_ids=g.ids, position_ids=g.pos, attention_mask=g.mask,
                        cache=clean.past_key_values).last_hidden_state
        got = model.lm_head(h[0])
        starts = (g.distance == 2).nonzero()[:, 0].tolist() + [len(g.distance)]
        for p, a, b in zip(anchor.tolist(), starts, starts[1:]):
            plain = torch.cat([ids[:p + 1], torch.full((b - a,), MASK)])[None]
            torch.testing.assert_close(got[a:b], model(plain).logits[0, p + 1:], rtol=1e-4, atol=1e-4)
            assert g.targets[a:b].tolist() == ids[p + 2:p + 2 + b - a].tolist()


def test_anchors_cover_the_response_or_draw_without_replacement():
    assert anchors(5, 12, None).tolist() == list(range(4, 10))
    drawn = anchors(5, 40, 6, torch.Generator().manual_seed(0))
    assert len(set(drawn.tolist())) == 6 and drawn.min() >= 4 and drawn.max() <= 37
    assert drawn.tolist() == sorted(drawn.tolist())


@pytest.mark.parametrize("examples,accum", [(10, 3), (9, 3), (1, 4)])
def test_every_epoch_visits_each_example_once_with_a_short_last_batch(examples, accum):
    per = steps_per_epoch(examples, accum)
    for epoch in range(3):
        seen = [i for s in range(epoch * per, (epoch + 1) * per) for i in batch_at(s, examples, accum, seed=0)]
        assert sorted(seen) == list(range(examples))
    assert batch_at(0, 10, 3, 0) != batch_at(per, 10, 3, 0) or examples == 1  # a fresh shuffle per epoch


def _stage(tmp_path, tiny_model_dir, tokenizer, out, *extra):
    from training.gated_stage import main

    data = tmp_path / "d.jsonl"
    if not data.exists():
        _distill_file(data, tokenizer)
    return main(["--base", tiny_model_dir, "--data", str(data), "--out", str(tmp_path / out), "--rank", "2",
                 "--accum", "2", "--epochs", "2", "--lr", "1e-2", "--warmup", "1", "--groups", "3", *extra])


def test_an_interrupted_gated_stage_resumes_to_the_same_adapters(tmp_path, tiny_model_dir, tokenizer):
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "once") == 0
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "twice", "--max-steps", "2") == 0
    assert torch.load(tmp_path / "twice" / "latest.pt")["state"]["step"] == 2
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "twice") == 0
    once, twice = (torch.load(tmp_path / d / "latest.pt") for d in ("once", "twice"))
    assert once["state"]["step"] == twice["state"]["step"] == 6  # 6 examples / 2, 2 epochs
    for k in once["gate"]:
        torch.testing.assert_close(once["gate"][k], twice["gate"][k], rtol=1e-5, atol=1e-6)
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "twice", "--rank", "3") == 2  # not the same run
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "twice", "--first", "4") == 2  # not the same data


def test_a_run_whose_data_file_grew_is_not_resumed_on_other_batches(tmp_path, tiny_model_dir, tokenizer, capsys):
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "grew", "--max-steps", "1") == 0
    rows = open(tmp_path / "d.jsonl").readlines()
    with open(tmp_path / "d.jsonl", "a") as f:  # a distill file still being written
        f.write(rows[-1].replace('"id": ', '"id": 99', 1))
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "grew") == 2
    assert "trained on 6 examples, --data and --first now give 7" in capsys.readouterr().out


def test_a_folder_that_another_process_trains_is_refused_and_free_once_it_stops(tmp_path, tiny_model_dir, tokenizer,
                                                                                capsys):
    import subprocess
    import sys

    (tmp_path / "busy").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from training.checkpoint import hold_folder; "
                               f"f = hold_folder({str(tmp_path / 'busy')!r}); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        assert holder.stdout.readline().strip() == "held"
        assert _stage(tmp_path, tiny_model_dir, tokenizer, "busy", "--max-steps", "1") == 2
        assert "is being trained by another process now" in capsys.readouterr().out
        assert not (tmp_path / "busy" / "latest.pt").exists()
    finally:
        holder.kill()
        holder.wait()
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "busy", "--max-steps", "1") == 0  # a killed holder leaves no lock


def test_two_data_files_train_what_their_concatenation_trains(tmp_path, tiny_model_dir, tokenizer):
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "one") == 0  # writes d.jsonl (6 training records)
    rows = open(tmp_path / "d.jsonl").readlines()
    (tmp_path / "d1.jsonl").write_text("".join(rows[:3]))
    (tmp_path / "d2.jsonl").write_text("".join(rows[3:]))
    from training.gated_stage import main

    assert main(["--base", tiny_model_dir, "--data", str(tmp_path / "d1.jsonl"), str(tmp_path / "d2.jsonl"),
                 "--out", str(tmp_path / "two"), "--rank", "2", "--accum", "2", "--epochs", "2", "--lr", "1e-2",
                 "--warmup", "1", "--groups", "3"]) == 0
    one, two = (torch.load(tmp_path / d / "latest.pt") for d in ("one", "two"))
    assert one["state"]["examples"] == two["state"]["examples"] == 6
    for k in one["gate"]:
        torch.testing.assert_close(one["gate"][k], two["gate"][k], rtol=0, atol=0)


def test_targets_hard_and_soft_train_different_adapters(tmp_path, tiny_model_dir, tokenizer):
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "soft", "--max-steps", "2", "--targets", "soft") == 0
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "hard", "--max-steps", "2", "--targets", "hard") == 0
    soft, hard = (torch.load(tmp_path / d / "latest.pt")["gate"] for d in ("soft", "hard"))
    assert any(not torch.allclose(soft[k], hard[k]) for k in soft)


def test_the_masks_learn_a_text_the_base_cannot_guess(tmp_path, tiny_model_dir, tokenizer):
    from training.gated_stage import main

    prompt = tokenizer("Tom has 12 apples.")["input_ids"]
    with open(tmp_path / "d.jsonl", "w") as f:
        for i in range(1, 9):
            f.write(json.dumps({"id": i, "prompt": "p", "prompt_ids": prompt, "response_ids": [40, 41, 42, 43] * 4,
                                "ended": False, "response": "r"}) + "\n")
    assert main(["--base", tiny_model_dir, "--data", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "o"),
                 "--rank", "4", "--accum", "4", "--epochs", "40", "--lr", "3e-2", "--warmup", "1", "--groups", "0",
                 "--targets", "hard"]) == 0
    log = [json.loads(line) for line in open(tmp_path / "o" / "log.jsonl")]
    assert log[0]["top1_d2"] < 0.5 and log[-1]["top1_d2"] > 0.9 and log[-1]["top1_d4"] > 0.9


def test_the_soft_loss_is_the_kl_to_the_base_at_the_position_that_predicts_the_same_token():
    import contextlib

    import torch.nn.functional as F

    from training.gated_stage import distance_weights, example_loss, loss_args

    model = tiny_llama()
    _randomise(attach_gate(model, MASK, rank=3, trainable=True))
    ids = torch.randint(6, 64, (14,), generator=torch.Generator().manual_seed(5)).tolist()
    start, B = 6, 3
    args = loss_args(groups=None, block_size=B, targets="soft")
    w = distance_weights("1,0.5", B)
    _, stats = example_loss(model, ids, start, args, w, torch.Generator(), contextlib.nullcontext)
    with torch.no_grad():
        base = F.log_softmax(model(torch.tensor([ids])).logits[0], -1)  # (n, V): the clean text is the base
        total = weight = 0.0
        for p in range(start - 1, len(ids) - 2):  # every anchor, written from the rule
            masked = F.log_softmax(model(torch.tensor([ids[:p + 1] + [MASK] * (B - 1)])).logits[0], -1)
            for j in range(1, B):
                if p + j + 1 > len(ids) - 1:
                    continue
                kl = (base[p + j].exp() * (base[p + j] - masked[p + j])).sum().item()
                total, weight = total + w[j + 1].item() * kl, weight + w[j + 1].item()
    assert stats["soft"] == pytest.approx(total / weight, rel=1e-4)


def test_the_repeat_penalty_is_the_unlikelihood_of_the_token_before_the_target_unless_it_is_the_target():
    import contextlib

    import torch.nn.functional as F

    from training.gated_stage import distance_weights, example_loss, loss_args

    model = tiny_llama()
    _randomise(attach_gate(model, MASK, rank=3, trainable=True))
    ids = [9, 12, 30, 30, 41, 7, 7, 7, 18, 25, 25, 33, 40, 11]  # repeats: there the previous token is the target
    start, B = 4, 3
    args = loss_args(groups=None, block_size=B, repeat_penalty=0.5, targets="hard")
    w = distance_weights("1,0.5", B)
    loss, stats = example_loss(model, ids, start, args, w, torch.Generator(), contextlib.nullcontext)
    with torch.no_grad():
        total = weight = said = 0.0
        for p in range(start - 1, len(ids) - 2):  # every anchor, written from the rule
            masked = F.softmax(model(torch.tensor([ids[:p + 1] + [MASK] * (B - 1)])).logits[0], -1)
            for j in range(1, B):
                target = p + j + 1
                if target > len(ids) - 1 or ids[target - 1] == ids[target]:
                    continue
                q = masked[p + j]
                total += w[j + 1].item() * -torch.log1p(-q[ids[target - 1]]).item()
                said += w[j + 1].item() * float(q.argmax().item() == ids[target - 1])
                weight += w[j + 1].item()
    assert stats["repeat"] == pytest.approx(total / weight, rel=1e-4)
    assert stats["says_prev"] == pytest.approx(said / weight, abs=1e-6)
    assert loss.item() == pytest.approx(stats["hard"] + 0.5 * stats["repeat"], rel=1e-5)


def test_a_gated_name_is_the_base_with_its_gate_and_the_base_file_is_not_copied(tiny_registry, tmp_path, monkeypatch):
    from mars_core import load_model, packaged
    from training.gate_export import export

    base, tok = load_model("tiny-packaged")
    params = attach_gate(base, tok.mask_token_id, rank=2, layers=1, trainable=True)
    _randomise(params, scale=0.2)
    snap = tmp_path / "latest.pt"
    torch.save({"gate": gate_state(base), "state": {"args": {"base": "tiny-packaged"}}}, snap)
    folder = tmp_path / "gated"
    export(str(snap), str(folder))
    (folder / "README.md").write_text("card")
    monkeypatch.setitem(packaged.DERIVED, "tiny-gated", ("tiny-packaged", folder))
    assert "tiny-gated" in packaged.available_names()
    model, _ = load_model("tiny-gated")
    made = tmp_path / "cache" / "models" / "tiny-gated"
    assert (made / "README.md").read_text() == "card" and (made / "gate.safetensors").is_file()
    base_file = tmp_path / "cache" / "models" / "tiny-packaged" / "model.safetensors"
    assert os.path.samefile(made / "model.safetensors", base_file)  # linked: the base is never changed
    from mars_core.gate import install_gate

    stored = load_model("tiny-packaged")[0]
    install_gate(stored, read_gate(str(folder / "gate.safetensors"))[0], tok.mask_token_id)
    ids = torch.tensor([[7, 9, 11, tok.mask_token_id, tok.mask_token_id]])
    with torch.no_grad():
        got, want, exported = model(ids).logits, base(ids).logits, stored(ids).logits
    assert torch.equal(got[:, :3], want[:, :3])  # real tokens: the base, exactly
    assert torch.equal(got, exported)  # masks: the stored (4-bit) gate, as exported
    assert (got[:, 3:] - load_model("tiny-packaged")[0](ids).logits[:, 3:]).abs().amax() > 1e-3


def test_an_exported_gated_model_decodes_with_its_gate_and_a_stock_load_is_the_base(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    from conftest import make_model
    from mars_core import load_model
    from mars_core.custom_generate import mars_decoding
    from mars_core.export import export
    from mars_core.gate import gate_of

    base, gated = make_model("llama", len(tokenizer)), make_model("llama", len(tokenizer))
    mask_id = tokenizer.mask_token_id
    _randomise(attach_gate(gated, mask_id, rank=4, trainable=True), scale=0.5)
    src = tmp_path / "src"
    base.save_pretrained(src)
    tokenizer.save_pretrained(src)
    save_gate(gated, str(src / "gate.safetensors"), dtype=torch.float32)
    summary = export(src, tmp_path / "out")
    assert "gate.safetensors" in summary["weights"] and any("mask-gated" in n for n in summary["notes"])
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="sdpa").eval()
    assert gate_of(stock) is None  # a stock load is the base
    prompt = tokenizer(["Tom has 12 apples and"], return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(stock(**prompt).logits, base(**prompt).logits)
    kw = dict(mode="mars", tau=0.3, max_new_tokens=16, do_sample=False)
    out = stock.generate(**prompt, custom_generate=mars_decoding, **kw)
    assert gate_of(stock) is not None  # attached on first use
    ours, tok = load_model(str(tmp_path / "out"))
    assert stock.generation_config.mars["repeat_guard"] is True  # a gated model's tau default
    want = generate(ours, tok, ["Tom has 12 apples and"], DecodeConfig(mode="mars", tau=0.3, max_new_tokens=16,
                                                                      cache="cursor", repeat_guard=True),
                    chat=False).token_ids[0]
    got = out[0, prompt["input_ids"].shape[1]:].tolist()
    assert got[:len(want)] == want


def test_the_gpu_recipe_runs_end_to_end_on_a_tiny_model(tmp_path, tiny_model_dir):
    """The one command (prompts, their answers, the soft stage, the hard stage from its adapters),
    here on the CPU with a tiny model; a second run resumes rather than redoing anything."""
    from training.gated_gpu import main

    argv = ["--out", str(tmp_path / "g"), "--base", tiny_model_dir, "--prompts", "9", "--max-new-tokens", "8",
            "--distill-batch", "4", "--accum", "4", "--epochs", "1", "--rank", "2", "--minutes", "5"]
    assert main(argv) == 0
    lines = (tmp_path / "g" / "distill.jsonl").read_text().splitlines()
    assert len(lines) == 9
    soft = torch.load(tmp_path / "g" / "stage" / "latest.pt")["state"]
    assert soft["step"] == soft["total_steps"] == 2  # 8 training prompts (id 0 is held out), 4 a step
    hard = torch.load(tmp_path / "g" / "stage-hard" / "latest.pt")["state"]
    assert hard["step"] == hard["total_steps"] == 1  # half an epoch
    assert (hard["args"]["targets"], hard["args"]["lr"], soft["args"]["targets"]) == ("hard", 1e-3, "soft")
    assert hard["args"]["init"] == str(tmp_path / "g" / "stage" / "latest.pt")
    assert hard["cpu_minutes"] >= soft["cpu_minutes"]  # the clock counts both stages
    stamps = [os.path.getmtime(tmp_path / "g" / d / "latest.pt") for d in ("stage", "stage-hard")]
    assert main(argv) == 0 and len((tmp_path / "g" / "distill.jsonl").read_text().splitlines()) == 9
    assert os.path.getmtime(tmp_path / "g" / "stage" / "latest.pt") == stamps[0]  # the soft stage is not run again
    assert main(argv + ["--hard-share", "0"]) == 0  # soft only: its stage resumes, at its end already
    assert main(argv + ["--hard-share", "1"]) == 2


def test_the_gpu_recipe_asks_the_generator_for_its_share_and_the_rest_over_its_answers(tmp_path, tiny_model_dir,
                                                                                      tokenizer):
    """--prompts 13 --template-prompts 8 --task-prompts 2: 8 generator prompts, 2 task prompts, and 3
    whose contexts are the generator prompts' answers (written here as prose: a tiny model's are
    not); the stage trains on the three answer files."""
    import json

    from training.chat_prompts import make_prompts
    from training.context_prompts import make_context_prompts, read_answers, usable
    from training.gated_gpu import main
    from training.task_prompts import make_task_prompts

    out = tmp_path / "g"
    out.mkdir()
    with open(out / "distill.jsonl", "w") as f:  # the generator's answers, already there: distill skips them
        for i, prompt in enumerate(make_prompts(8, 1)):
            text = " ".join(f"Answer {i} says fact{i}x{k} about item{k} here." for k in range(4))
            f.write(json.dumps({"id": i, "prompt": prompt.rstrip(".?") + "?", "prompt_ids": tokenizer(prompt)["input_ids"],
                                "response_ids": tokenizer(text)["input_ids"][:12], "ended": True, "response": text}) + "\n")
    argv = ["--out", str(out), "--base", tiny_model_dir, "--prompts", "13", "--template-prompts", "8", "--task-prompts", "2",
            "--max-new-tokens", "6", "--distill-batch", "4", "--accum", "4", "--epochs", "1", "--rank", "2",
            "--minutes", "5", "--hard-share", "0"]
    assert main(argv) == 0
    contexts = [json.loads(line) for line in open(out / "context-prompts.jsonl")]
    want = make_context_prompts(usable(read_answers([str(out / "distill.jsonl")])), 3, 1)
    assert [r["prompt"] for r in contexts] == want and [r["id"] for r in contexts] == list(range(200_000, 200_003))
    assert sorted(json.loads(line)["id"] for line in open(out / "distill-context.jsonl")) == list(range(200_000, 200_003))
    tasks = [json.loads(line) for line in open(out / "task-prompts.jsonl")]
    assert [r["prompt"] for r in tasks] == make_task_prompts(2, 1) and [r["id"] for r in tasks] == [300_000, 300_001]
    assert sorted(json.loads(line)["id"] for line in open(out / "distill-task.jsonl")) == [300_000, 300_001]
    soft = torch.load(out / "stage" / "latest.pt")["state"]
    assert soft["args"]["data"] == [str(out / p) for p in ("distill.jsonl", "distill-task.jsonl", "distill-context.jsonl")]
    assert soft["examples"] == 7 + 1 + 2  # ids 0, 300000 and 200000 are held out


def test_init_starts_from_another_runs_adapters_and_continues_its_clock(tmp_path, tiny_model_dir, tokenizer):
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "first", "--max-steps", "2") == 0
    first = torch.load(tmp_path / "first" / "latest.pt")
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "second", "--init", str(tmp_path / "first" / "latest.pt"),
                  "--max-steps", "1", "--lr", "0") == 0  # lr 0: the adapters stay what --init gave
    second = torch.load(tmp_path / "second" / "latest.pt")
    for k in first["gate"]:
        assert torch.equal(first["gate"][k], second["gate"][k]), k
    assert second["state"]["step"] == 1 and second["state"]["cpu_minutes"] >= first["state"]["cpu_minutes"]
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "third", "--init", str(tmp_path / "nothing.pt")) == 2


@pytest.mark.parametrize("bits", [16, 4])
def test_init_from_a_shipped_gate_folder_on_a_machine_without_the_run(tmp_path, tiny_model_dir, tokenizer, bits,
                                                                       capsys):
    """A new machine has the exported gate (assets/models/<name>/gate.safetensors) but not the run's
    folder: --init takes the folder, its stored adapters (bf16 or 4 bits) and its recorded CPU-minutes."""
    import json

    from training.gate_export import export

    assert _stage(tmp_path, tiny_model_dir, tokenizer, "first", "--max-steps", "2") == 0
    folder = tmp_path / "shipped"
    export(str(tmp_path / "first" / "latest.pt"), str(folder), tiny_model_dir, bits=bits)
    stored, _ = read_gate(str(folder / "gate.safetensors"))
    (folder / "training_config.json").write_text(json.dumps({"cpu_minutes": 12.5}))
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "second", "--init", str(folder), "--max-steps", "1",
                  "--lr", "0") == 0
    first, second = torch.load(tmp_path / "first" / "latest.pt"), torch.load(tmp_path / "second" / "latest.pt")
    for k in first["gate"]:
        assert torch.equal(stored[k].float(), second["gate"][k]), k
        if bits == 16:
            assert torch.equal(first["gate"][k].to(torch.bfloat16).float(), second["gate"][k]), k
    assert second["state"]["cpu_minutes"] >= 12.5
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "third", "--init", str(tmp_path / "first")) == 2  # no gate file
    capsys.readouterr()
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "fourth", "--init", str(folder), "--rank", "3") == 2
    assert "holds rank-2 adapters: give --rank 2" in capsys.readouterr().out  # the shipped gate is rank 8


def test_a_stored_gate_of_another_shape_is_refused_with_its_name():
    from mars_core.gate import load_gate_state

    a, b = tiny_llama(), tiny_llama()
    attach_gate(a, MASK, rank=3)
    attach_gate(b, MASK, rank=2)
    with pytest.raises(ValueError, match="shapes"):
        load_gate_state(b, gate_state(a))
    c = tiny_llama()
    attach_gate(c, MASK, rank=2, layers=1)
    with pytest.raises(ValueError, match="does not match"):
        load_gate_state(c, gate_state(b))


def test_stacked_siblings_give_each_layer_its_own_delta_and_leave_nothing_behind():
    """q, k, v (and gate, up) read one input: an installed gate computes their adapters in two
    matmuls (A stacked, B block-diagonal). Each layer must still get exactly its own B @ A x
    (a wrong column range or sibling index gives another layer's delta), and the stash must be
    empty after a forward (a tensor left there would make a compiled graph guard on it)."""
    from mars_core.gate import Siblings, fuse_siblings

    model = tiny_llama()
    _randomise(attach_gate(model, MASK, rank=3, trainable=True), seed=4)
    x = torch.randn(2, 5, 32)
    layers = wrapped_layers(model)
    with torch.no_grad():
        want = {k: (x @ m.lora_a.T) @ m.lora_b.T for k, m in layers.items() if ".mlp.down" not in k and "o_proj" not in k}
        assert fuse_siblings(model) == 2 * len(model.model.layers)
        for k in want:
            assert layers[k].siblings is not None
            got = layers[k].delta(x)
            assert got.shape == want[k].shape and torch.allclose(got, want[k], atol=1e-5), k
        ids = torch.tensor([[7, 9, MASK, MASK, 11]])
        model(ids)
    groups = {id(m.siblings): m.siblings for m in layers.values() if m.siblings is not None}
    assert len(groups) == 2 * len(model.model.layers)
    assert all(isinstance(g, Siblings) and g.x is None and g.out is None for g in groups.values())


def test_a_loaded_gate_follows_new_adapter_values():
    """The stacked copies are derived: loading other values into an installed gate re-stacks them."""
    from mars_core.gate import install_gate, load_gate_state

    first, second = tiny_llama(), tiny_llama()
    _randomise(attach_gate(first, MASK, rank=3, trainable=True), seed=1)
    _randomise(attach_gate(second, MASK, rank=3, trainable=True), seed=2)
    model = tiny_llama()
    install_gate(model, gate_state(first), MASK)
    load_gate_state(model, gate_state(second))
    ids = torch.tensor([[7, 9, MASK, MASK, MASK]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, second(ids).logits, atol=1e-5)


def test_a_gate_on_some_matrices_stacks_the_siblings_it_has():
    """A gate on q and v only (k left the base's) stacks q with v: each still gets its own delta."""
    from mars_core.gate import fuse_siblings

    model = tiny_llama()
    _randomise(attach_gate(model, MASK, rank=3, trainable=True, matrices=("q_proj", "v_proj", "up_proj")), seed=5)
    layers = wrapped_layers(model)
    assert not any(".k_proj" in k or ".gate_proj" in k for k in layers)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want = {k: (x @ m.lora_a.T) @ m.lora_b.T for k, m in layers.items()}
        assert fuse_siblings(model) == len(model.model.layers)  # (q, v); up has no wrapped sibling
        for k, m in layers.items():
            assert (m.siblings is None) == (".up_proj" in k), k
            assert torch.allclose(m.delta(x), want[k], atol=1e-5), k


def test_the_stage_adapts_only_the_matrices_asked(tmp_path, tiny_model_dir, tokenizer):
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "qv", "--max-steps", "1", "--matrices", "q_proj,v_proj") == 0
    keys = torch.load(tmp_path / "qv" / "latest.pt")["gate"]
    assert {k.split(".")[-3] for k in keys if k.endswith(".lora_a")} == {"q_proj", "v_proj"}
    assert _stage(tmp_path, tiny_model_dir, tokenizer, "bad", "--matrices", "q_proj,wq") == 2  # a clear error
