"""MARS as a transformers `custom_generate` method, on the bundled model (fp32, CPU, offline):
the callable and the generated Hub folder equal `mars_core.generate` token for token, and plain
`generate` at tau = 1 and in mode="lossless" (the callable and a freshly generated method folder); streaming,
sampling, outputs and bad input."""
import pathlib

import pytest
import torch
from transformers import AutoModelForCausalLM

from mars_core import DecodeConfig, TauControl, generate, load_model
from mars_core.custom_generate import mars_decoding
from mars_core.prompts import encode_prompt

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "assets" / "models" / "tiny-mars-b4"
PROMPTS = ["What is 12 + 30?", "Sort the list 45, 12, 88, 31, 7 from smallest to largest.",
           "A box holds 24 pens. How many pens do 3 boxes hold?"]
NEW = 48


@pytest.fixture(scope="module")
def ref():
    return load_model(str(BUNDLED), device="cpu")


@pytest.fixture(scope="module")
def hf_model():
    return AutoModelForCausalLM.from_pretrained(str(BUNDLED)).eval()


def batch(tok, prompts):
    """Left-padded input_ids and attention_mask, as a tokenizer with padding_side='left' gives them."""
    ids = [encode_prompt(tok, p) for p in prompts]
    width = max(map(len, ids))
    x = torch.tensor([[tok.pad_token_id] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    return x, mask


def expected(ref_model, tok, prompts, cfg):
    """What generate must return after the prompt: mars_core's tokens, the EOS that ended a row,
    then padding; and the per-forward accept counts."""
    res = generate(ref_model, tok, prompts, cfg)
    rows = [ids + ([tok.eos_token_id] if len(ids) < cfg.max_new_tokens else []) for ids in res.token_ids]
    width = max(map(len, rows))
    tail = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    return tail, torch.tensor(res.stats.accepted_per_step)


class Puts:
    """A streamer that records what it is given."""

    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


@pytest.mark.parametrize("tau,kv_cache", [(0.95, None), (0.7, "none"), (0.9, "cursor")])
def test_callable_equals_mars_core(ref, hf_model, tau, kv_cache):
    model, tok = ref
    x, mask = batch(tok, PROMPTS)
    out = hf_model.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding, max_new_tokens=NEW,
                            mask_token_id=tok.mask_token_id, tau=tau, block_size=4, kv_cache=kv_cache,
                            return_dict_in_generate=True)
    tail, counts = expected(model, tok, PROMPTS, DecodeConfig(tau=tau, cache=kv_cache or "cursor", max_new_tokens=NEW))
    assert torch.equal(out.sequences[:, : x.shape[1]], x)
    assert torch.equal(out.sequences[:, x.shape[1]:], tail)
    assert torch.equal(out.accept_counts, counts)
    assert (counts.sum(0) > 0).all() and counts.max() > 1  # several tokens per forward happened


def test_the_repeat_guard_reaches_the_decoder(ref, hf_model):
    model, tok = ref
    x, mask = batch(tok, PROMPTS)
    out = hf_model.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding, max_new_tokens=NEW,
                            mask_token_id=tok.mask_token_id, tau=0.0, repeat_guard=True, return_dict_in_generate=True)
    tail, counts = expected(model, tok, PROMPTS, DecodeConfig(tau=0.0, repeat_guard=True, cache="cursor",
                                                               max_new_tokens=NEW))
    assert torch.equal(out.sequences[:, x.shape[1]:], tail) and torch.equal(out.accept_counts, counts)
    _, unguarded = expected(model, tok, PROMPTS, DecodeConfig(tau=0.0, cache="cursor", max_new_tokens=NEW))
    assert not torch.equal(counts, unguarded)  # the guard changed a step here


def test_tau_one_equals_plain_generate(hf_model, ref):
    _, tok = ref
    x, mask = batch(tok, PROMPTS)
    plain = hf_model.generate(input_ids=x, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    mars = hf_model.generate(input_ids=x, attention_mask=mask, max_new_tokens=NEW, custom_generate=mars_decoding,
                             mask_token_id=tok.mask_token_id, tau=1.0)
    assert torch.equal(plain, mars)


@pytest.mark.parametrize("kv_cache", [None, "none"])
def test_lossless_equals_plain_generate(hf_model, ref, kv_cache):
    _, tok = ref
    x, mask = batch(tok, PROMPTS)
    plain = hf_model.generate(input_ids=x, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    given = {} if kv_cache is None else dict(kv_cache=kv_cache)
    out = hf_model.generate(input_ids=x, attention_mask=mask, max_new_tokens=NEW, custom_generate=mars_decoding,
                            mask_token_id=tok.mask_token_id, mode="lossless", tau=0.5, return_dict_in_generate=True,
                            **given)
    assert torch.equal(plain, out.sequences)
    assert out.accept_counts.max() > 1  # verified drafts: several tokens per forward
    with pytest.raises(ValueError, match="runs on cache='cursor'"):
        hf_model.generate(input_ids=x, attention_mask=mask, max_new_tokens=4, custom_generate=mars_decoding,
                          mask_token_id=tok.mask_token_id, mode="lossless", kv_cache="sliding")


@pytest.mark.parametrize("shape", [dict(draft_budget=(6, 2), prompt_lookup=2, prompt_lookup_tokens=5),
                                   dict(draft_tree=(2, 2, 1)), dict(draft_groups="all")])
def test_draft_shapes_pass_through_and_equal_mars_core(hf_model, ref, shape):
    """A draft shape given to generate (as fastest_exact's configuration is, through generate_kwargs)
    decodes as mars_core does with it, forward for forward, and still gives plain greedy's tokens."""
    from mars_core.custom_generate import generate_kwargs

    model, tok = ref
    x, mask = batch(tok, PROMPTS)
    cfg = DecodeConfig(mode="lossless", cache="cursor", max_new_tokens=NEW, **shape)
    tail, counts = expected(model, tok, PROMPTS, cfg)
    kwargs = generate_kwargs(cfg)
    assert {k: kwargs[k] for k in shape} == shape and "max_new_tokens" not in kwargs
    out = hf_model.generate(input_ids=x, attention_mask=mask, max_new_tokens=NEW, custom_generate=mars_decoding,
                            mask_token_id=tok.mask_token_id, return_dict_in_generate=True, **kwargs)
    plain = hf_model.generate(input_ids=x, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(out.sequences[:, x.shape[1]:], tail) and torch.equal(plain, out.sequences)
    assert torch.equal(out.accept_counts.reshape(-1), counts.reshape(-1))


def assert_lossless_through_folder(model, tok, folder):
    """mode="lossless" through a custom_generate folder (local, trust_remote_code, offline) equals
    plain greedy generate token for token, on the cursor cache by default and without a cache;
    the sliding cache is refused as through the callable."""
    x, mask = batch(tok, PROMPTS)
    plain = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    for given in ({}, dict(kv_cache="none")):
        out = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=NEW, custom_generate=str(folder),
                             trust_remote_code=True, mask_token_id=tok.mask_token_id, mode="lossless", tau=0.5,
                             return_dict_in_generate=True, **given)
        assert torch.equal(plain, out.sequences), given
        assert out.accept_counts.max() > 1, given  # verified drafts: several tokens per forward
    with pytest.raises(ValueError, match="runs on cache='cursor'"):
        model.generate(input_ids=x, attention_mask=mask, max_new_tokens=4, custom_generate=str(folder),
                       trust_remote_code=True, mask_token_id=tok.mask_token_id, mode="lossless", kv_cache="sliding")


def test_lossless_through_a_fresh_method_folder_equals_plain_generate(hf_model, ref, tmp_path):
    """The method-only folder (what the release command writes for the method's own repository),
    generated now: nothing generated is kept in git."""
    from mars_core.export import main

    main(["--method-only", str(tmp_path / "mars")])
    assert_lossless_through_folder(hf_model, ref[1], tmp_path / "mars")


def test_sampling_equals_mars_core(ref, hf_model):
    model, tok = ref
    x, mask = batch(tok, PROMPTS[:2])
    out = hf_model.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding, max_new_tokens=NEW,
                            mask_token_id=tok.mask_token_id, tau=0.9, do_sample=True, temperature=0.8, top_k=None,
                            seed=3)
    tail, _ = expected(model, tok, PROMPTS[:2], DecodeConfig(tau=0.9, temperature=0.8, seed=3, max_new_tokens=NEW))
    assert torch.equal(out[:, x.shape[1]:], tail)
    torch.manual_seed(0)  # without a seed, sampling follows torch's global generator, as generate does
    a = hf_model.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding, max_new_tokens=NEW,
                          mask_token_id=tok.mask_token_id, do_sample=True, temperature=1.5)
    torch.manual_seed(0)
    b = hf_model.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding, max_new_tokens=NEW,
                          mask_token_id=tok.mask_token_id, do_sample=True, temperature=1.5)
    assert torch.equal(a, b)


def test_streamer_gets_one_put_per_forward(ref, hf_model):
    model, tok = ref
    x, mask = batch(tok, PROMPTS[1:2])
    s = Puts()
    out = hf_model.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding, streamer=s,
                            mask_token_id=tok.mask_token_id, max_new_tokens=NEW, return_dict_in_generate=True)
    assert s.puts[0] == x[0].tolist()  # generate itself puts the prompt first
    assert len(s.puts) == 1 + out.accept_counts.shape[0] and s.ended
    assert sum(s.puts[1:], []) == out.sequences[0, x.shape[1]:].tolist()
    counts = out.accept_counts[:, 0].tolist()
    assert [len(p) for p in s.puts[1:-1]] == counts[:-1]
    assert s.puts[-1][-1] == tok.eos_token_id  # the last forward's put ends with the EOS it produced


def test_tau_control_and_mode_ar(ref, hf_model):
    model, tok = ref
    x, mask = batch(tok, PROMPTS[:1])
    ar = hf_model.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding, mode="ar",
                           mask_token_id=tok.mask_token_id, max_new_tokens=NEW, return_dict_in_generate=True)
    assert ar.accept_counts.max() == 1
    control = TauControl(0.0)  # accepts the whole block ...

    class Slow(Puts):
        def put(self, value):
            super().put(value)
            if len(self.puts) == 2:
                control.tau = 1.0  # ... until the first forward is out: from then on one token per forward

    out = hf_model.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding, tau_control=control,
                            streamer=Slow(), mask_token_id=tok.mask_token_id, max_new_tokens=NEW,
                            return_dict_in_generate=True)
    counts = out.accept_counts[:, 0].tolist()
    assert counts[0] == 4 and set(counts[1:]) == {1}


@pytest.mark.parametrize("kwargs,message", [
    (dict(mode="fastest"), "unknown mode 'fastest'; allowed: "),
    (dict(tau=1.5), "tau for the probability metric must be in [0, 1]"),
    (dict(mask_token_id=None), "MARS needs the id of the mask token"),
    (dict(num_beams=2), "does not support num_beams=2"),
    (dict(output_scores=True), "does not support output_scores=True"),
    (dict(kv_cache="paged"), "unknown cache mode 'paged'"),
    (dict(kv_cache="sliding"), "no decoder here runs mode='mars' on cache='sliding'; available: "),
    (dict(kv_cache="block"), "no decoder here runs mode='mars' on cache='block'"),
    (dict(max_time=30.0), "unsupported stopping criteria: \\['MaxTimeCriteria'\\]"),
    (dict(mode="spec"), "mode='spec' needs a draft model"),
])
def test_bad_requests_are_clear_errors(ref, hf_model, kwargs, message):
    _, tok = ref
    x, mask = batch(tok, PROMPTS[:2])
    args = dict(mask_token_id=tok.mask_token_id, max_new_tokens=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("[0", r"\[0").replace("(", r"\(")):
        hf_model.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding, **args)


def test_bad_inputs_are_clear_errors(ref, hf_model):
    _, tok = ref
    x, mask = batch(tok, PROMPTS[:2])
    right = torch.flip(mask, dims=[1])
    with pytest.raises(ValueError, match="left padding"):
        hf_model.generate(input_ids=x, attention_mask=right, custom_generate=mars_decoding,
                          mask_token_id=tok.mask_token_id, max_new_tokens=8)
    with pytest.raises(ValueError, match="a streamer needs a batch of one"):
        hf_model.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding, streamer=Puts(),
                          mask_token_id=tok.mask_token_id, max_new_tokens=8)
    eager = AutoModelForCausalLM.from_pretrained(str(BUNDLED), attn_implementation="eager")
    with pytest.raises(ValueError, match='attn_implementation="sdpa"'):
        eager.generate(input_ids=x, attention_mask=mask, custom_generate=mars_decoding,
                       mask_token_id=tok.mask_token_id, max_new_tokens=8)
