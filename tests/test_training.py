"""Tests for training/data.py and training/train.py: CPU, the `micro` preset, seconds each."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import mars_core
import mars_core.prompts
from mars_core import DecodeConfig
from mars_core.loading import load_tokenizer
from training import data as D
from training import checkpoint as C
from training import loop as L
from training import train as T
from tasks.synthetic import make_examples
from training.tokenizer import build_tokenizer, chat_ids, corpus_from_examples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Small and quick: ~110 usable synthetic examples of <= 256 tokens, batches of 8.
FAST = dict(data="synthetic", num_examples=128, max_length=256, batch_size=8, lr=3e-3,
            log_every=1, quiet=True)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(corpus_from_examples(make_examples(300, 0)), 300)


@pytest.fixture(scope="module")
def tok_dir(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def ar_run(tok_dir, tmp_path_factory):
    """A 12-step stage-1 run from scratch, shared by the tests that need a checkpoint."""
    out = str(tmp_path_factory.mktemp("runs") / "ar")
    summary = T.train(T.TrainConfig(stage="ar", output=out, tokenizer=tok_dir, model_config="micro",
                                    max_steps=12, save_every=5, **FAST))
    return out, summary


def losses(output: str, key: str = "loss") -> list[float]:
    with open(os.path.join(output, C.LOG_FILE), encoding="utf-8") as f:
        return [json.loads(line)[key] for line in f if line.strip()]


def weights(output: str) -> dict:
    return load_file(os.path.join(output, "model.safetensors"))


def write_lines(path, lines) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


CHAT = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "2 + 3 = 5.\n#### 5"}]


# --------------------------------------------------------------------------
# data.py
# --------------------------------------------------------------------------

def test_labels_cover_assistant_content_and_eos(tokenizer):
    messages = [*CHAT, {"role": "user", "content": "And 4 + 4?"}, {"role": "assistant", "content": "#### 8"}]
    example = D.tokenize_record(tokenizer, messages, max_length=512)
    assert list(example.input_ids) == chat_ids(tokenizer, messages)
    labelled = [t for t in example.labels if t != D.IGNORE]
    assert tokenizer.decode(labelled) == "2 + 3 = 5.\n#### 5<|end|>#### 8<|end|>"
    # labels are unshifted: each labelled position holds its own token
    assert all(l in (D.IGNORE, i) for i, l in zip(example.input_ids, example.labels))


def test_read_jsonl_errors_and_skips(tmp_path):
    good = json.dumps({"messages": CHAT})
    bad = write_lines(tmp_path / "bad.jsonl", [good, '{"messages": [', good])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: malformed JSON"):
        D.read_jsonl(bad)
    wrong = write_lines(tmp_path / "wrong.jsonl", [good, json.dumps({"messages": [{"role": "user"}]})])
    with pytest.raises(ValueError, match=r"wrong\.jsonl:2: messages\[0\]"):
        D.read_jsonl(wrong)
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match="empty"):
            D.read_jsonl(str(tmp_path / name))
    mixed = write_lines(tmp_path / "mixed.jsonl", [
        good, json.dumps({"messages": CHAT[:1]}), json.dumps({"text": "no messages"}), "", good])
    records = D.read_jsonl(mixed)
    assert len(records.conversations) == 2
    assert records.skipped == {"no assistant turn": 1, "no messages": 1}


def test_load_records_sources(tmp_path):
    records = D.load_records("synthetic", num_examples=5, seed=1)
    assert len(records.conversations) == 5 and records.num_skipped == 0
    with pytest.raises(ValueError, match="does not exist"):
        D.load_records(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="pip install datasets"):
        D.load_records("someone/some-dataset")


def test_too_long_is_skipped_or_truncated(tokenizer):
    long = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "word " * 200}]
    dataset, skipped = D.build_dataset(tokenizer, [CHAT, long], max_length=64)
    assert len(dataset) == 1 and skipped == {"longer than max_length": 1}
    dataset, skipped = D.build_dataset(tokenizer, [CHAT, long], max_length=64, truncate=True)
    assert len(dataset) == 2 and not skipped and max(dataset.lengths) == 64
    # a prompt that fills max_length leaves nothing to learn: skipped, not an empty-loss example
    _, skipped = D.build_dataset(tokenizer, [[{"role": "user", "content": "x " * 100}, CHAT[1]]],
                                 max_length=16, truncate=True)
    assert skipped == {"no response tokens within max_length": 1}


def test_collate_pads_right():
    batch = [D.Tokenized((5, 6, 7), (-100, 6, 7)), D.Tokenized((8,), (8,))]
    out = D.Collator(pad_id=0)(batch)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert out["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_length_grouped_sampler_is_deterministic_and_groups():
    lengths = torch.randint(10, 500, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = D.LengthGroupedBatchSampler(lengths, batch_size=8, seed=3, mega_batches=4)
    epoch0 = sampler.batches(0)
    assert epoch0 == D.LengthGroupedBatchSampler(lengths, 8, 3, 4).batches(0)
    assert epoch0 != sampler.batches(1)
    flat = [i for b in epoch0 for i in b]
    assert len(flat) == len(set(flat)) == len(sampler) * 8 == 1000
    padded = sum(8 * max(lengths[i] for i in b) for b in epoch0)
    shuffled = torch.randperm(1000, generator=torch.Generator().manual_seed(1)).tolist()
    random_padded = sum(8 * max(lengths[i] for i in shuffled[k: k + 8]) for k in range(0, 1000, 8))
    assert padded < 0.8 * random_padded


# --------------------------------------------------------------------------
# train.py
# --------------------------------------------------------------------------

def test_config_validation(tok_dir, tmp_path):
    with pytest.raises(ValueError, match="--init"):
        T.TrainConfig(stage="mars", output=str(tmp_path))
    with pytest.raises(ValueError, match="--tokenizer"):
        T.TrainConfig(stage="ar", output=str(tmp_path), model_config="micro")
    with pytest.raises(ValueError, match="not both"):
        T.TrainConfig(stage="ar", output=str(tmp_path), tokenizer=tok_dir, model_config="micro",
                      max_steps=3, epochs=1)
    with pytest.raises(ValueError, match="batch_size"):
        T.TrainConfig(stage="ar", output=str(tmp_path), tokenizer=tok_dir, model_config="micro", batch_size=0)
    with pytest.raises(SystemExit) as exit_info:
        T.main(["--help"])
    assert exit_info.value.code == 0


def test_ar_stage_learns_and_saves(ar_run):
    out, summary = ar_run
    assert summary["status"] == "finished" and summary["steps"] == 12
    assert summary["tokens_per_s"] > 0 and summary["peak_memory_mb"] > 0
    assert summary["skipped"].get("longer than max_length", 0) > 0  # a few synthetic examples exceed 256
    curve = losses(out)
    assert len(curve) == 12 and sum(curve[-3:]) / 3 < sum(curve[:3]) / 3 - 0.5
    assert sorted(os.listdir(os.path.join(out, C.CKPT_DIR))) == ["step-10", "step-12"]
    with open(os.path.join(out, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"] == 4  # <|end|>
    model, tok = mars_core.load_model(out)
    assert model.config._attn_implementation == "sdpa" and tok.mask_token == "<|mask|>"
    # the saved folder decodes as HF greedy does: same tokenizer, EOS from generation_config.json
    prompt = "What is 2 + 3?"
    result = mars_core.generate(model, tok, [prompt], DecodeConfig(mode="ar", max_new_tokens=8))
    ids = torch.tensor([mars_core.prompts.encode_prompt(tok, prompt)])
    hf = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8)
    hf = hf[0, ids.shape[1]:].tolist()
    assert result.token_ids[0] == (hf[: hf.index(4)] if 4 in hf else hf)


def test_mars_stage_learns_and_saves(ar_run, tokenizer, tmp_path):
    init, _ = ar_run
    out = str(tmp_path / "mars")
    summary = T.train(T.TrainConfig(stage="mars", output=out, init=init, max_steps=10, save_every=0,
                                    block_size=4, **FAST))
    assert summary["block_size"] == 4 and summary["ar_weight"] == 1.0
    total, noisy, clean = (losses(out, k) for k in ("loss", "noisy", "clean"))
    assert all(abs(t - (n + c)) < 1e-4 for t, n, c in zip(total, noisy, clean))
    assert sum(total[-3:]) / 3 < sum(total[:3]) / 3 - 0.3
    with open(os.path.join(out, C.CONFIG_FILE)) as f:
        record = json.load(f)
    assert record["stage"] == "mars" and record["steps"] == 10 and record["args"]["init"] == init
    model, tok = mars_core.load_model(out)
    tau_one = mars_core.generate(model, tok, ["What is 2 + 3?"], DecodeConfig(tau=1.0, max_new_tokens=8))
    ar = mars_core.generate(model, tok, ["What is 2 + 3?"], DecodeConfig(mode="ar", max_new_tokens=8))
    assert tau_one.token_ids == ar.token_ids  # whether MARS training pays off: test_mars_training_*
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == len(tokenizer)
    # stage 2 kept stage 1's tokenizer exactly (not the Qwen2Tokenizer AutoTokenizer would pick)
    saved = load_tokenizer(out)
    assert len(saved) == len(tokenizer) and saved.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()


TOY_ANSWER = "1234567890123456"  # one digit per token: the same 16 tokens after every prompt


@pytest.fixture(scope="module")
def toy(tok_dir, tmp_path_factory):
    """A learnable toy: every prompt (same length) is answered by TOY_ANSWER. Stage 1 learns it;
    stage 2 (MARS) must learn to predict its masked blocks."""
    root = tmp_path_factory.mktemp("toy")
    data = write_lines(root / "toy.jsonl", [json.dumps({"messages": [
        {"role": "user", "content": f"Count, please ({k})."},
        {"role": "assistant", "content": TOY_ANSWER}]}) for k in range(10, 74)])
    common = dict(data=data, max_length=48, batch_size=8, lr=1e-2, save_every=0, log_every=1, quiet=True)
    ar = str(root / "ar")
    T.train(T.TrainConfig(stage="ar", output=ar, tokenizer=tok_dir, model_config="micro", max_steps=30, **common))
    mars = str(root / "mars")
    T.train(T.TrainConfig(stage="mars", output=mars, init=ar, block_size=4, max_steps=30, **common))
    return ar, mars, data


def test_mars_training_yields_several_tokens_per_forward(toy):
    ar, mars, _ = toy
    prompts = [f"Count, please ({k})." for k in (12, 50, 99)]
    cfg = DecodeConfig(tau=0.5, block_size=4, max_new_tokens=24)
    tpf = {}
    for name, path in (("ar", ar), ("mars", mars)):
        model, tok = mars_core.load_model(path)
        result = mars_core.generate(model, tok, prompts, cfg)
        tpf[name] = result.stats.tokens_per_forward
        if name == "mars":
            assert result.texts == [TOY_ANSWER] * 3
    # the same decoding of the stage-1 model: its guesses at [MASK] slots rarely pass tau
    assert tpf["mars"] >= 2.0 and tpf["mars"] >= tpf["ar"] + 1.0, tpf


def test_resume_matches_uninterrupted_run(tok_dir, tmp_path):
    # ~113 examples, batches of 8, 2 micro-batches per step: 7 steps per epoch. Stopping at step
    # 3 (mid epoch 0) and at step 9 (mid epoch 1) exercises the batch skipping on both sides of
    # an epoch boundary.
    base = dict(stage="ar", tokenizer=tok_dir, model_config="micro", max_steps=10, save_every=3, grad_accum=2,
                **FAST)
    straight = str(tmp_path / "straight")
    T.train(T.TrainConfig(output=straight, **base))
    split = str(tmp_path / "split")
    first = T.train(T.TrainConfig(output=split, stop_at=3, **base))
    assert first["status"] == "stopped" and [s for s, _ in C.list_checkpoints(split)] == [3]
    assert not os.path.exists(os.path.join(split, "model.safetensors"))
    second = T.train(T.TrainConfig(output=split, stop_at=8, resume=True, **base))
    assert second["status"] == "stopped" and second["epoch"] == 1
    third = T.train(T.TrainConfig(output=split, resume=True, **base))
    assert third["status"] == "finished" and third["steps"] == 10
    assert losses(split) == losses(straight)
    a, b = weights(straight), weights(split)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="options differ"):
        T.train(T.TrainConfig(output=split, resume=True, **{**base, "lr": 1e-3}))


def test_epochs_count_optimizer_steps(tok_dir, tmp_path):
    # ~113 examples / 8 = 14 micro-batches per epoch; with 4 per step the 4th step of each
    # epoch has only 2 (accelerate syncs at the end of the data): 4 steps per epoch.
    summary = T.train(T.TrainConfig(stage="ar", output=str(tmp_path / "ep"), tokenizer=tok_dir,
                                    model_config="micro", epochs=2, grad_accum=4, save_every=0, **FAST))
    assert summary["total_steps"] == summary["steps"] == 8 and summary["epoch"] == 2
    with open(os.path.join(tmp_path, "ep", C.LOG_FILE)) as f:
        progress = [json.loads(line)["epoch"] for line in f]
    assert progress[3] == 1.0 and progress[-1] == 2.0 and progress == sorted(progress)


def test_signal_saves_checkpoint_then_resumes(tok_dir, tmp_path, monkeypatch):
    base = dict(stage="ar", tokenizer=tok_dir, model_config="micro", max_steps=5, save_every=0, **FAST)
    out = str(tmp_path / "sig")
    calls = {"n": 0}
    original = L.Run.micro_step

    def micro_step(self, batch):
        calls["n"] += 1
        if calls["n"] == 2:  # as if `kill -TERM` arrived during step 2
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, batch)

    monkeypatch.setattr(L.Run, "micro_step", micro_step)
    summary = T.train(T.TrainConfig(output=out, **base))
    monkeypatch.undo()
    assert summary["status"] == "interrupted" and summary["steps"] == 2
    assert [s for s, _ in C.list_checkpoints(out)] == [2]
    assert T.train(T.TrainConfig(output=out, resume=True, **base))["steps"] == 5


def test_refuses_to_start_fresh_over_a_run(ar_run, tok_dir):
    out, _ = ar_run
    with pytest.raises(ValueError, match="--resume to continue it or --overwrite"):
        T.train(T.TrainConfig(stage="ar", output=out, tokenizer=tok_dir, model_config="micro",
                              max_steps=12, **FAST))


def test_bad_data_fails_clearly(tok_dir, tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [json.dumps({"messages": CHAT[:1]})] * 3)
    with pytest.raises(ValueError, match=r"no usable training examples.*no assistant turn"):
        T.train(T.TrainConfig(stage="ar", output=str(tmp_path / "o"), tokenizer=tok_dir, model_config="micro",
                              max_steps=2, **{**FAST, "data": path}))


def test_two_rank_data_parallel_run(tok_dir, tmp_path):
    out = str(tmp_path / "ddp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "training.train", "--stage", "ar", "--output", out, "--tokenizer", tok_dir,
           "--model-config", "micro", "--num-examples", "128", "--max-length", "256", "--batch-size", "4",
           "--max-steps", "3", "--lr", "3e-3", "--log-every", "1", "--threads", "1", "--quiet"]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, C.CONFIG_FILE)) as f:
        record = json.load(f)
    assert record["world_size"] == 2
    first = record["first_batch_sha1"]
    assert len(first) == 2 and first[0] != first[1]  # each rank got its own batch
    assert len(losses(out)) == 3
    mars_core.load_model(out)


def test_two_rank_mars_stage(toy, tmp_path):
    """The MARS stage under a real 2-process torchrun (CPU, gloo), from the toy's stage-1 model."""
    ar, _, data = toy
    out = str(tmp_path / "ddp-mars")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "training.train", "--stage", "mars", "--init", ar, "--output", out, "--data", data,
           "--max-length", "48", "--batch-size", "4", "--block-size", "4", "--max-steps", "3", "--lr", "1e-2",
           "--log-every", "1", "--threads", "1", "--quiet"]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, C.CONFIG_FILE)) as f:
        record = json.load(f)
    assert record["world_size"] == 2 and record["stage"] == "mars" and record["block_size"] == 4
    first = record["first_batch_sha1"]
    assert len(first) == 2 and first[0] != first[1]  # each rank got its own batch
    noisy, clean, total = (losses(out, k) for k in ("noisy", "clean", "loss"))
    assert len(total) == 3 and all(abs(t - (n + c)) < 1e-4 for t, n, c in zip(total, noisy, clean))
    mars_core.load_model(out)
