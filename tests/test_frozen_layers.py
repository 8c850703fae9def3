"""The frozen-lower-layers MARS loss against `mars_loss` on the full [noisy | clean] layout."""
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mars_core.loss import IGNORE, mars_loss
from training.frozen_layers import compact_inputs, lower_hidden, run_layers, trainable_upper, upper_loss

MASK = 5


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("start,n,block_size", [(7, 20, 4), (8, 20, 4), (9, 21, 4), (1, 9, 4), (5, 17, 3), (6, 12, 1)])
def test_compact_loss_equals_full_layout(start, n, block_size):
    model = tiny_llama()
    g = torch.Generator().manual_seed(n + start)
    ids = torch.randint(6, 64, (n,), generator=g).tolist()
    labels = torch.tensor(ids)[None].clone()
    labels[:, :start] = IGNORE
    full = mars_loss(model, torch.tensor([ids]), labels, block_size=block_size, mask_token_id=MASK)
    c = compact_inputs(ids, start, block_size, MASK)
    for split in (0, 2, 4):
        noisy, clean = upper_loss(model, lower_hidden(model, c, split), c, split)
        torch.testing.assert_close(noisy, full.noisy, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(clean, full.clean, rtol=1e-5, atol=1e-5)


def test_compact_layout_drops_only_whole_blocks_before_the_response():
    c = compact_inputs(list(range(10, 30)), start=9, block_size=4, mask_id=MASK)
    # the last prompt token (8) opens block 2: noisy positions 8..19 kept, response masked
    assert c.pos[0, :12].tolist() == list(range(8, 20))
    assert c.ids[0, :12].tolist() == [18] + [MASK] * 11
    assert c.ids[0, 12:].tolist() == list(range(10, 30))
    assert c.targets.tolist() == list(range(19, 30))
    assert c.noisy_q.tolist() == list(range(0, 11)) and c.clean_q.tolist() == list(range(12 + 8, 12 + 19))


def test_target_distance_from_the_rule():
    # B = 4, prompt 0..8 (last prompt token 8, in block 2 = positions 8..11), response 9..19.
    # Query 8 is real (distance 1); 9..11 are masks in 8's block (distances 2..4); 12 is the first
    # mask of block 3, which sees real tokens up to 11 (the clean block 2): it predicts 13,
    # distance 2; 15 (last of block 3) predicts 16, five past 11: the B + 1 target.
    c = compact_inputs(list(range(10, 30)), start=9, block_size=4, mask_id=MASK)
    assert c.distance.tolist() == [1, 2, 3, 4, 2, 3, 4, 5, 2, 3, 4]


def test_max_distance_drops_exactly_the_far_targets():
    model = tiny_llama()
    c = compact_inputs(list(range(10, 30)), start=9, block_size=4, mask_id=MASK)
    hidden = lower_hidden(model, c, 2)
    rows = model.model.norm(run_layers(model, hidden, c, model.model.layers[2:])[0, c.noisy_q])
    ce = torch.nn.functional.cross_entropy(model.lm_head(rows), c.targets, reduction="none")
    keep = [i for i in range(11) if i != 7]  # query 15, the one distance-5 target
    noisy, _ = upper_loss(model, hidden, c, 2, max_distance=4)
    torch.testing.assert_close(noisy, ce[keep].mean())
    noisy_all, _ = upper_loss(model, hidden, c, 2)
    torch.testing.assert_close(noisy_all, ce.mean())


def test_gradients_reach_only_the_upper_layers():
    model = tiny_llama()
    params = trainable_upper(model, 2)
    assert [id(p) for p in params] == [id(p) for p in model.model.layers[2:].parameters()]  # every one of them
    c = compact_inputs(list(range(10, 26)), 6, 4, MASK)
    noisy, clean = upper_loss(model, lower_hidden(model, c, 2), c, 2)
    (noisy + clean).backward()
    assert all(p.grad is not None for p in model.model.layers[2:].parameters())
    assert all(p.grad is None for p in model.model.layers[:2].parameters())
    assert model.model.embed_tokens.weight.grad is None


def test_response_must_start_inside():
    with pytest.raises(ValueError, match="response must start"):
        compact_inputs([1, 2, 3], 3, 4, MASK)


def _distill_file(path, tok, n=6):
    import json
    import random

    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(1, n + 1):  # id 20 would be held out; these are all training ids
            prompt = tok("Tom has 12 apples.")["input_ids"]
            response = [rng.randrange(10, 200) for _ in range(rng.randrange(5, 12))]
            f.write(json.dumps({"id": i, "prompt": "p", "prompt_ids": prompt, "response_ids": response,
                                "ended": i % 2 == 0, "response": "r"}) + "\n")


@pytest.fixture
def tiny_model_dir(tmp_path, tokenizer):
    from conftest import make_model

    m = make_model("llama", len(tokenizer))
    m.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    return str(tmp_path / "base")


def test_an_interrupted_stage_resumes_to_the_same_weights(tmp_path, tiny_model_dir, tokenizer):
    from training.frozen_stage import main

    tok = tokenizer
    data = tmp_path / "d.jsonl"
    _distill_file(data, tok)
    common = ["--base", tiny_model_dir, "--data", str(data), "--train-layers", "1", "--accum", "2",
              "--epochs", "2", "--lr", "1e-3", "--warmup", "2"]
    assert main(common + ["--out", str(tmp_path / "once")]) == 0
    assert main(common + ["--out", str(tmp_path / "twice"), "--max-steps", "3"]) == 0
    assert torch.load(tmp_path / "twice" / "latest.pt")["state"]["step"] == 3
    assert main(common + ["--out", str(tmp_path / "twice")]) == 0
    once = torch.load(tmp_path / "once" / "latest.pt")
    twice = torch.load(tmp_path / "twice" / "latest.pt")
    assert once["state"]["step"] == twice["state"]["step"] == 6
    for key, value in once["layers"].items():
        torch.testing.assert_close(twice["layers"][key], value, rtol=0, atol=0)
    assert sorted(os.listdir(tmp_path / "twice" / "snapshots")) == ["step000003.pt", "step000006.pt"]
    from safetensors.torch import load_file

    base = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    assert all(not torch.equal(base[k], v) for k, v in once["layers"].items())  # every trained tensor moved
    assert all(k.startswith("model.layers.1.") for k in once["layers"])


def test_a_stage_can_start_from_another_runs_layers(tmp_path, tiny_model_dir, tokenizer):
    from training.frozen_stage import main

    data = tmp_path / "d.jsonl"
    _distill_file(data, tokenizer)
    common = ["--base", tiny_model_dir, "--data", str(data), "--accum", "2", "--epochs", "1", "--warmup", "1"]
    assert main(common + ["--out", str(tmp_path / "a"), "--train-layers", "1", "--lr", "1e-3"]) == 0
    a = torch.load(tmp_path / "a" / "latest.pt")
    # lr 0: the one step moves nothing, so the new run's layers are exactly the ones it started from
    init = ["--init", str(tmp_path / "a" / "latest.pt")]
    assert main(common + init + ["--out", str(tmp_path / "b"), "--train-layers", "1", "--lr", "0", "--max-steps", "1"]) == 0
    b = torch.load(tmp_path / "b" / "latest.pt")
    assert b["state"]["step"] == 1  # a fresh schedule, not a's step 3
    assert b["state"]["minutes"] >= a["state"]["minutes"]  # the clock continues a's
    for key, value in a["layers"].items():
        torch.testing.assert_close(b["layers"][key], value, rtol=0, atol=0)
    # layers of another split are refused with a message, not loaded half
    assert main(common + init + ["--out", str(tmp_path / "c"), "--train-layers", "2"]) == 2
    assert not os.path.exists(tmp_path / "c" / "latest.pt")


def test_delta_holds_what_moved_in_bf16():
    from training.delta import make_delta

    base = {"a": torch.ones(4, 4), "b": torch.zeros(3)}
    trained = {"a": torch.ones(4, 4) + torch.linspace(-0.01, 0.01, 16).reshape(4, 4), "b": torch.zeros(3)}
    delta = make_delta(trained, base, "bf16")
    assert list(delta) == ["a"] and delta["a"].dtype == torch.bfloat16  # "b" did not move
    torch.testing.assert_close(base["a"] + delta["a"].float(), trained["a"], rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="does not"):
        make_delta({"c": torch.ones(1)}, base)


def test_int8_delta_rows_and_their_scales():
    from mars_core.packaged import delta_tensors
    from training.delta import make_delta

    base = {"w": torch.zeros(2, 3), "n": torch.ones(3), "z": torch.zeros(2, 2)}
    # row 0's largest |value| is 1.27, so its step is 0.01; row 1 is all zero (a scale of 0, no NaN)
    trained = {"w": torch.tensor([[1.27, -0.5, 0.004], [0.0, 0.0, 0.0]]), "n": torch.tensor([1.0, 1.5, 1.0]),
               "z": torch.tensor([[0.0, 0.0], [0.0, -2.54]])}
    delta = make_delta(trained, base)
    assert delta["w"].dtype == torch.int8 and delta["w"].tolist() == [[127, -50, 0], [0, 0, 0]]
    torch.testing.assert_close(delta["w.row_scale"], torch.tensor([0.01, 0.0]))
    assert delta["z"].tolist() == [[0, 0], [0, -127]] and delta["n"].dtype == torch.bfloat16  # a vector stays bf16
    back = delta_tensors(delta)
    assert sorted(back) == ["n", "w", "z"]
    torch.testing.assert_close(back["w"], torch.tensor([[1.27, -0.5, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(back["z"], trained["z"])
    torch.testing.assert_close(back["n"], torch.tensor([0.0, 0.5, 0.0]))
    with pytest.raises(ValueError, match="row_scale"):
        delta_tensors({"w": delta["w"]})  # an int8 matrix without its scales
    with pytest.raises(ValueError, match="without its matrix"):
        delta_tensors({"w.row_scale": delta["w.row_scale"]})
