"""`training.frozen_stage` against the rules its options state: every option that changes what is
trained is checked by a run of the stage against an oracle written here from the rule (the
examples it keeps, the batch of each step, the learning rate, the loss), so an option that is
ignored, inverted or rounded differently fails an assertion. The loss of one example is
`training.frozen_layers`' (checked against `mars_loss` in tests/test_frozen_layers.py)."""
import json
import math
import os
import random

import pytest
import torch

from mars_core import load_model
from test_frozen_layers import tiny_model_dir  # noqa: F401 (fixture)
from training.frozen_layers import compact_inputs, lower_hidden, trainable_upper, upper_loss
from training.frozen_stage import main
from training.lora import add_lora

PROMPTS = ["Tom has 12 apples.", "Sort the list 45, 12, 88, 31: what is the sum?", "Hi"]


def write_data(path, tok, n=7, seed=0, same_lengths_as=None):
    """n records with ids 1..n plus a held-out id 20 (third line) and an empty answer (fifth line)."""
    rng = random.Random(seed)
    rows = []
    for i in range(1, n + 1):
        prompt = tok(PROMPTS[i % len(PROMPTS)])["input_ids"]
        length = rng.randrange(4, 12) if same_lengths_as is None else len(same_lengths_as[len(rows)]["response_ids"])
        rows.append({"id": i, "prompt": "p", "prompt_ids": prompt, "response": "r", "ended": i % 2 == 0,
                     "response_ids": [rng.randrange(10, 250) for _ in range(length)]})
    rows.insert(2, dict(rows[0], id=20))  # every 20th id is the dev set
    rows.insert(4, dict(rows[1], id=7_001, response_ids=[]))  # ended: its ids would be the EOS alone
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows


def rule_examples(path, eos, max_len, first=None):
    """The docstring's rule: of the first `first` lines, ids not divisible by 20 with an answer;
    prompt + answer (+ EOS when it ended) cut at max_len; kept when the prompt + 1 < max_len."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()][:first]
    out = []
    for r in rows:
        if r["id"] % 20 and r["response_ids"] and len(r["prompt_ids"]) + 1 < max_len:
            ids = r["prompt_ids"] + r["response_ids"] + ([eos] if r["ended"] else [])
            out.append((ids[:max_len], len(r["prompt_ids"])))
    return out


@pytest.mark.parametrize("first", [None, 3, 9, 12])
def test_examples_of_several_files_are_those_of_their_concatenation_in_order(tmp_path, tokenizer, first):
    from training.frozen_stage import read_examples

    a = write_data(tmp_path / "a.jsonl", tokenizer)
    b = [dict(r, id=r["id"] + 100) for r in write_data(tmp_path / "b.jsonl", tokenizer, seed=3)]
    with open(tmp_path / "b.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in b)
    with open(tmp_path / "ab.jsonl", "w") as f:  # id 120 is held out in b as 20 is in a
        f.writelines(json.dumps(r) + "\n" for r in a + b)
    got = read_examples([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")], 2, 64, first)
    assert [(ids, start) for _, ids, start in got] == rule_examples(tmp_path / "ab.jsonl", 2, 64, first)
    assert [i for i, _, _ in got][:2] == [1, 2]  # a's first: the order given
    with pytest.raises(ValueError, match="prompt id 1 is in the training data twice"):
        read_examples([str(tmp_path / "a.jsonl"), str(tmp_path / "a.jsonl")], 2, 64)


def rule_batch(step, n, accum, seed):
    per = -(-n // accum)  # every epoch ends with its short batch
    epoch, i = divmod(step, per)
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    return order[i * accum:(i + 1) * accum]


def rule_lr(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


DEFAULTS = dict(train_layers=6, block_size=4, ar_weight=1.0, lr=1e-4, warmup=10, epochs=3.0, accum=8, max_len=448,
                max_distance=None, first=None, seed=0)


def oracle(model_dir, data, steps, lora=None, losses=None, **opts):
    """The upper layers after `steps` optimizer steps, computed from the rules (with `lora` = (rank,
    alpha): the model with adapters on them). Each step's mean noisy and clean loss is appended
    to `losses` when given."""
    o = dict(DEFAULTS, **opts)
    torch.manual_seed(o["seed"])
    model, tok = load_model(model_dir, dtype="float32")
    split = model.config.num_hidden_layers - o["train_layers"]
    examples = rule_examples(data, tok.eos_token_id, o["max_len"], o["first"])
    total = math.ceil(o["epochs"] * -(-len(examples) // o["accum"]))
    params = trainable_upper(model, split) if lora is None else add_lora(model, split, *lora)
    model.train()
    opt = torch.optim.AdamW(params, lr=o["lr"], weight_decay=0.0, betas=(0.9, 0.95))
    for step in range(min(steps, total)):
        opt.param_groups[0]["lr"] = rule_lr(step, total, o["lr"], o["warmup"])
        batch = rule_batch(step, len(examples), o["accum"], o["seed"])
        sums = [0.0, 0.0]
        for i in batch:
            c = compact_inputs(*examples[i], o["block_size"], tok.mask_token_id)
            noisy, clean = upper_loss(model, lower_hidden(model, c, split), c, split, o["max_distance"])
            ((noisy + o["ar_weight"] * clean) / len(batch)).backward()
            sums = [sums[0] + noisy.item() / len(batch), sums[1] + clean.item() / len(batch)]
        if losses is not None:
            losses.append(sums)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    if lora is not None:
        return model
    return {k: v for k, v in model.state_dict().items() if k.startswith(tuple(f"model.layers.{i}." for i in range(split, 99)))}


def flags(opts):
    out = []
    for k, v in opts.items():
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def refused(argv, entry=main) -> bool:
    """The command stopped with its message (exit 2); a crash on the way is not a refusal."""
    try:
        return entry(argv) == 2
    except Exception:  # noqa: BLE001 (any crash fails the caller's assertion, as an assertion)
        return False


def run(tmp_path, model_dir, data, name, opts, extra=()):
    out = tmp_path / name
    assert main(["--base", model_dir, "--data", str(data), "--out", str(out), *flags(opts), *extra]) == 0
    return torch.load(out / "latest.pt"), [json.loads(line) for line in open(out / "log.jsonl")]


CASES = {
    "short last batch": dict(train_layers=1, accum=3, epochs=2, lr=1e-3, warmup=2),
    "every option moved": dict(train_layers=2, block_size=3, ar_weight=0.25, max_distance=2, accum=2, epochs=1.5,
                               lr=5e-3, warmup=1, first=7, max_len=17, seed=3),
    "long warm-up, far targets kept": dict(train_layers=1, block_size=2, ar_weight=2.0, max_distance=3, accum=3,
                                           epochs=3, lr=2e-3, warmup=4, seed=1, max_len=29),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_stage_trains_exactly_what_its_options_say(case, tmp_path, tiny_model_dir, tokenizer):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    opts = CASES[case]
    saved, log = run(tmp_path, tiny_model_dir, data, "run", opts)
    n = len(rule_examples(data, tokenizer.eos_token_id, opts.get("max_len", 448), opts.get("first")))
    total = math.ceil(opts["epochs"] * -(-n // opts["accum"]))
    assert [r["step"] for r in log] == list(range(1, total + 1))  # every epoch runs to its end
    assert saved["state"]["step"] == total and saved["state"]["examples"] == n
    for r in log:
        assert r["lr"] == pytest.approx(rule_lr(r["step"] - 1, total, opts["lr"], opts["warmup"]), rel=1e-12)
    losses = []
    want = oracle(tiny_model_dir, data, total, losses=losses, **opts)
    assert [x for r in log for x in (r["noisy"], r["clean"])] == pytest.approx([x for pair in losses for x in pair], abs=1e-4)
    assert set(saved["layers"]) == set(want)
    for key, value in want.items():
        torch.testing.assert_close(saved["layers"][key], value, rtol=0, atol=1e-7, msg=key)


def test_the_oracle_sees_each_option(tmp_path, tiny_model_dir, tokenizer):
    """Each option of the moved case changes the trained layers: the test above would see it ignored."""
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    opts = CASES["every option moved"]
    want = oracle(tiny_model_dir, data, 3, **opts)
    for key, default in DEFAULTS.items():
        if key in opts and key != "train_layers":
            other = oracle(tiny_model_dir, data, 3, **dict(opts, **{key: default}))
            assert any(not torch.equal(other[k], v) for k, v in want.items()), key


def test_epochs_count_short_batches_and_a_stage_stops_at_its_limits(tmp_path, tiny_model_dir, tokenizer):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)  # 7 training examples
    common = dict(train_layers=1, accum=3, lr=1e-3, warmup=1)
    _, log = run(tmp_path, tiny_model_dir, data, "e", dict(common, epochs=1))
    assert len(log) == 3  # 3 + 3 + 1
    saved, log = run(tmp_path, tiny_model_dir, data, "m", dict(common, epochs=2, minutes=0))
    assert len(log) == 1 and saved["state"]["step"] == 1  # --minutes 0: one step, then stop and save
    _, log = run(tmp_path, tiny_model_dir, data, "s", dict(common, epochs=2, max_steps=2))
    assert len(log) == 2


def test_snapshots_every_snapshot_minutes(tmp_path, tiny_model_dir, tokenizer):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    common = dict(train_layers=1, accum=4, epochs=1, warmup=1)
    run(tmp_path, tiny_model_dir, data, "every", dict(common, snapshot_minutes=0))
    assert sorted(os.listdir(tmp_path / "every" / "snapshots")) == ["step000001.pt", "step000002.pt"]
    run(tmp_path, tiny_model_dir, data, "end", common)  # default 10 minutes: only the last step
    assert sorted(os.listdir(tmp_path / "end" / "snapshots")) == ["step000002.pt"]


def test_threads_sets_torch_threads(tmp_path, tiny_model_dir, tokenizer):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    before = torch.get_num_threads()
    try:
        run(tmp_path, tiny_model_dir, data, "t", dict(train_layers=1, accum=4, epochs=1, max_steps=1, threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_resumed_stage_must_keep_its_options(tmp_path, tiny_model_dir, tokenizer, capsys):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    common = ["--base", tiny_model_dir, "--data", str(data), "--out", str(tmp_path / "r"), "--train-layers", "1",
              "--epochs", "2", "--max-steps", "1"]
    assert main(common + ["--accum", "3"]) == 0
    assert refused(common + ["--accum", "4"])
    assert "--accum 3 (now 4)" in capsys.readouterr().out
    assert main(common + ["--accum", "3", "--max-steps", "2", "--minutes", "5"]) == 0  # limits may change
    assert torch.load(tmp_path / "r" / "latest.pt")["state"]["step"] == 2


def test_a_run_saved_by_the_old_schedule_resumes_only_where_the_order_is_the_same(tmp_path, tiny_model_dir, tokenizer,
                                                                                 capsys):
    """Before the short last batch, a step was `accum` examples counted across epochs: the same
    order only when accum divides the examples."""
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)  # 7 examples
    for accum, code in (("7", 0), ("3", 2)):
        out = tmp_path / f"old{accum}"
        common = ["--base", tiny_model_dir, "--data", str(data), "--out", str(out), "--train-layers", "1",
                  "--epochs", "2", "--accum", accum]
        assert main(common + ["--max-steps", "1"]) == 0
        saved = torch.load(out / "latest.pt")
        saved["state"] = {k: v for k, v in saved["state"].items() if k not in ("schedule", "total_steps")}
        torch.save(saved, out / "latest.pt")
        assert main(common) == code
    assert "old schedule" in capsys.readouterr().out


# the frozen layers' cache (--lower, --build-cache)

def test_build_cache_computes_every_example_and_trains_nothing(tmp_path, tiny_model_dir, tokenizer):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    assert main(["--base", tiny_model_dir, "--data", str(data), "--out", str(tmp_path / "o"), "--train-layers", "1",
                 "--lower", str(tmp_path / "low"), "--build-cache"]) == 0
    assert not os.path.exists(tmp_path / "o" / "latest.pt") and not os.path.exists(tmp_path / "o" / "lower")
    assert len([f for f in os.listdir(tmp_path / "low") if f.endswith(".pt")]) == 7


def test_a_run_on_a_filled_shared_cache_trains_as_a_fresh_one(tmp_path, tiny_model_dir, tokenizer):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    opts = dict(train_layers=1, accum=4, epochs=1, lr=1e-3, warmup=1, block_size=3)
    fresh, _ = run(tmp_path, tiny_model_dir, data, "fresh", opts)
    run(tmp_path, tiny_model_dir, data, "first", opts, ["--lower", str(tmp_path / "low")])
    again, _ = run(tmp_path, tiny_model_dir, data, "second", opts, ["--lower", str(tmp_path / "low")])
    for key, value in fresh["layers"].items():
        torch.testing.assert_close(again["layers"][key], value, rtol=0, atol=0)


@pytest.mark.parametrize("change,named", [({"train_layers": 2}, "--train-layers"), ({"block_size": 2}, "--block-size")])
def test_a_shared_cache_of_another_setting_is_refused(change, named, tmp_path, tiny_model_dir, tokenizer, capsys):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    opts = dict(train_layers=1, accum=4, epochs=1, warmup=1, block_size=4)
    lower = ["--lower", str(tmp_path / "low")]
    run(tmp_path, tiny_model_dir, data, "a", opts, lower)
    other = ["--base", tiny_model_dir, "--data", str(data), "--out", str(tmp_path / "b"), *flags(dict(opts, **change))]
    assert refused(other + lower)
    assert named in capsys.readouterr().out and not os.path.exists(tmp_path / "b" / "latest.pt")


def test_a_shared_cache_of_another_base_is_refused(tmp_path, tiny_model_dir, tokenizer, capsys):
    from conftest import make_model

    other_base = tmp_path / "other"
    make_model("llama", len(tokenizer), seed=7).save_pretrained(other_base)
    tokenizer.save_pretrained(other_base)
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    opts = dict(train_layers=1, accum=4, epochs=1, max_steps=1)
    run(tmp_path, tiny_model_dir, data, "a", opts, ["--lower", str(tmp_path / "low")])
    assert refused(["--base", str(other_base), "--data", str(data), "--out", str(tmp_path / "b"), *flags(opts),
                    "--lower", str(tmp_path / "low")])
    assert "--base" in capsys.readouterr().out


def test_a_shared_cache_never_serves_another_records_tokens(tmp_path, tiny_model_dir, tokenizer):
    """Same record ids, same lengths, other tokens (another data file, or an edited one)."""
    first, second = tmp_path / "d1.jsonl", tmp_path / "d2.jsonl"
    rows = write_data(first, tokenizer, seed=0)
    write_data(second, tokenizer, seed=5, same_lengths_as=[r for r in rows if r["id"] < 20 and r["response_ids"]])
    opts = dict(train_layers=1, accum=4, epochs=1, lr=1e-3, warmup=1)
    run(tmp_path, tiny_model_dir, first, "a", opts, ["--lower", str(tmp_path / "low")])
    shared, _ = run(tmp_path, tiny_model_dir, second, "b", opts, ["--lower", str(tmp_path / "low")])
    fresh, _ = run(tmp_path, tiny_model_dir, second, "c", opts)
    for key, value in fresh["layers"].items():
        torch.testing.assert_close(shared["layers"][key], value, rtol=0, atol=0)


def test_a_planted_entry_of_another_example_is_recomputed(tmp_path, tiny_model_dir, tokenizer):
    """An entry whose file name fits but whose tokens do not (a hash collision, a hand-copied
    file) is never read."""
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    opts = dict(train_layers=1, accum=4, epochs=1, lr=1e-3, warmup=1)
    fresh, _ = run(tmp_path, tiny_model_dir, data, "fresh", opts)
    low = tmp_path / "low"
    assert main(["--base", tiny_model_dir, "--data", str(data), "--out", str(tmp_path / "b"), "--train-layers", "1",
                 "--lower", str(low), "--build-cache"]) == 0
    names = sorted(f for f in os.listdir(low) if f.endswith(".pt"))
    other_ids = torch.load(low / names[0])["ids"]
    for name in names[1:]:  # another example's tokens, states of the right shape but wrong
        entry = torch.load(low / name)
        torch.save(dict(entry, ids=other_ids, hidden=torch.randn_like(entry["hidden"])), low / name)
    again, _ = run(tmp_path, tiny_model_dir, data, "again", opts, ["--lower", str(low)])
    for key, value in fresh["layers"].items():
        torch.testing.assert_close(again["layers"][key], value, rtol=0, atol=0)


def _edited_copy(src, dst, key, tokenizer):
    from safetensors.torch import load_file, save_file

    import shutil
    shutil.copytree(src, dst)
    weights = load_file(os.path.join(src, "model.safetensors"))
    weights[key] = weights[key] * 1.5
    save_file(weights, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


def test_the_cache_key_sees_the_frozen_layers_and_only_them(tmp_path, tiny_model_dir, tokenizer, capsys):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    opts = dict(train_layers=1, accum=4, epochs=1, max_steps=1)  # layer 0 frozen, layer 1 trained
    lower = ["--lower", str(tmp_path / "low")]
    run(tmp_path, tiny_model_dir, data, "a", opts, lower)
    upper = _edited_copy(tiny_model_dir, tmp_path / "up", "model.layers.1.mlp.up_proj.weight", tokenizer)
    assert main(["--base", upper, "--data", str(data), "--out", str(tmp_path / "b"), *flags(opts), *lower]) == 0
    frozen = _edited_copy(tiny_model_dir, tmp_path / "fr", "model.layers.0.mlp.up_proj.weight", tokenizer)
    assert refused(["--base", frozen, "--data", str(data), "--out", str(tmp_path / "c"), *flags(opts), *lower])
    assert "--base" in capsys.readouterr().out


def test_a_run_from_another_runs_layers_continues_its_clock(tmp_path, tiny_model_dir, tokenizer):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    saved, _ = run(tmp_path, tiny_model_dir, data, "a", dict(train_layers=1, accum=4, epochs=1, max_steps=1))
    saved["state"]["minutes"] = 100.0  # as if it had trained 100 minutes
    torch.save(saved, tmp_path / "a100.pt")
    b, _ = run(tmp_path, tiny_model_dir, data, "b", dict(train_layers=1, accum=4, epochs=1, max_steps=1),
               ["--init", str(tmp_path / "a100.pt")])
    assert 100.0 <= b["state"]["minutes"] < 101.0


@pytest.mark.parametrize("bad,named", [(["--accum", "0"], "--accum"), (["--epochs", "-1"], "--epochs"),
                                       (["--max-distance", "0"], "--max-distance"), (["--lr=-1e-3"], "--lr"),
                                       (["--lora-alpha", "4"], "--lora-rank"), (["--train-layers", "3"], "1..2")])
def test_options_no_run_can_use_are_refused_with_what_is_allowed(bad, named, tmp_path, tiny_model_dir, tokenizer,
                                                                   capsys):
    data = tmp_path / "d.jsonl"
    write_data(data, tokenizer)
    assert refused(["--base", tiny_model_dir, "--data", str(data), "--out", str(tmp_path / "o"), *bad])
    assert named in capsys.readouterr().out and not os.path.exists(tmp_path / "o" / "latest.pt")
