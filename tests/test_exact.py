"""Lossless MARS and MARS x speculative decoding: token for token AR, reference vs cursor, rows alone."""
import random
import weakref

import pytest
import torch

from conftest import PROMPTS, make_model
from mars_core import DecodeConfig, TauControl, generate, stream
from mars_core.decode_exact import decode_exact
from mars_core.decoding import Rows
from mars_core.prompts import encode_prompt, special_ids
from mars_core.verify_forward import CursorContext, NoCacheContext
from test_cursor import BATCH
from test_decoders import hf_greedy

EXACT = ["none", "cursor"]
# Keyed by the model object, weakly: a model's id() is reused by the next one allocated after it is
# freed, and a stale entry would hand one model the other's AR output (seen in CI as 12 failures).
_AR = weakref.WeakKeyDictionary()  # model -> its greedy outputs of BATCH


def ar_batch(model, tokenizer, n=24):
    """Greedy `model.generate` of every BATCH prompt (computed once per model)."""
    if model not in _AR:
        _AR[model] = [hf_greedy(model, tokenizer, p, 40) for p in BATCH]
    return [t[:n] for t in _AR[model]]


@pytest.fixture(scope="module")
def draft(tokenizer):
    """Another random Qwen2 (same vocabulary): it disagrees with the target most of the time."""
    return make_model("qwen2", len(tokenizer), seed=2, head_scale=30.0)


@pytest.mark.parametrize("cache,B", [("cursor", 1), ("cursor", 2), ("cursor", 4), ("none", 4)])
def test_lossless_greedy_is_ar(model, tokenizer, cache, B):
    cfg = DecodeConfig(mode="lossless", block_size=B, cache=cache, max_new_tokens=24)
    prompts = BATCH if cache == "cursor" else BATCH[:3]  # the reference is slow: k + 1 forwards a step
    want = ar_batch(model, tokenizer)[: len(prompts)]
    res = generate(model, tokenizer, prompts, cfg)
    assert res.token_ids == want
    for size in (1, 2):
        assert generate(model, tokenizer, prompts[:size], cfg).token_ids == want[:size]
    assert (res.stats.drafted > 0) == (B > 1) and res.stats.draft_forwards == 0


@pytest.mark.parametrize("groups", ["all", "last", "ends"])
def test_context_forwards_agree(confident_model, tokenizer, groups):
    """One cursor forward with the 4-D group mask = separate ordinary causal forwards, logit for logit."""
    rng = random.Random(0)
    prompts = [encode_prompt(tokenizer, p) for p in BATCH]
    mask_id, pad_id, _ = special_ids(confident_model, tokenizer)
    ref = NoCacheContext(confident_model, len(prompts), mask_id, pad_id, "cpu")
    fast = CursorContext(confident_model, len(prompts), 256, mask_id, pad_id, "cpu")
    new = prompts
    for step in range(4):
        B = [4, 3, 1, 4][step]
        drafts = [[rng.randrange(10, 200) for _ in range(rng.randrange(0, 4))] for _ in prompts]
        with torch.no_grad():
            v0, g0, s0 = ref.forward(new, drafts, B, groups)
            v1, g1, s1 = fast.forward(new, drafts, B, groups)
        assert v0.shape == v1.shape and g0.shape == g1.shape and torch.equal(s0, s1)
        torch.testing.assert_close(v1, v0, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(g1, g0, atol=1e-4, rtol=1e-4)
        j = [rng.randrange(0, len(d) + 1) for d in drafts]
        ref.keep(j)
        fast.keep(j)
        new = [[rng.randrange(10, 200) for _ in range(rng.randrange(1, 3))] for _ in prompts]


class AdversarialDrafter:
    """Proposes the true AR continuation with some tokens made wrong (or all of them)."""

    K = 5

    def __init__(self, rows: Rows, truth: list[list[int]], wrong: float, temperature: float, V: int):
        self.rows, self.truth, self.wrong, self.V = rows, truth, wrong, V
        self.rng = random.Random(1)
        self.sampling = temperature > 0
        self.correct = 0  # drafts that matched the truth before the first wrong one

    def propose(self):
        drafts = []
        for r in self.rows.active:
            have = len(self.rows.out[r])
            d = list(self.truth[r][have:have + self.rng.randrange(0, self.K + 1)])
            d = [t if self.rng.random() >= self.wrong else (t + 1 + self.rng.randrange(50)) % self.V for t in d]
            ok = 0
            while ok < len(d) and d[ok] == self.truth[r][have + ok]:
                ok += 1
            self.correct += ok
            drafts.append(d)
        q = None
        if self.sampling:  # a fixed draft is a valid proposal: q = one-hot
            K = max(len(d) for d in drafts)
            q = torch.zeros(len(drafts), K, self.V)
            for i, d in enumerate(drafts):
                for a, t in enumerate(d):
                    q[i, a, t] = 1.0
        return drafts, q

    def update(self, j, emitted, drafts, q):
        pass

    def select(self, keep):
        pass


def run_adversarial(model, tokenizer, cfg, prompts, truth, wrong):
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    mask_id, pad_id, stop = special_ids(model, tokenizer)
    rows = Rows(ids, cfg, TauControl(cfg.tau, cfg.metric), stop, "cpu")
    drafter = AdversarialDrafter(rows, truth, wrong, cfg.temperature, model.config.vocab_size)
    for _ in decode_exact(model, rows, mask_id, pad_id, drafter=drafter):
        pass
    return rows, drafter


@pytest.mark.parametrize("cache,wrong", [("cursor", 0.0), ("cursor", 0.3), ("cursor", 1.0), ("none", 0.3)])
def test_wrong_drafts_never_change_the_output(model, tokenizer, cache, wrong):
    cfg = DecodeConfig(mode="lossless", block_size=4, cache=cache, max_new_tokens=24)
    truth = ar_batch(model, tokenizer, 40)
    prompts = BATCH if cache == "cursor" else BATCH[:3]
    rows, drafter = run_adversarial(model, tokenizer, cfg, prompts, truth, wrong)
    assert rows.out == [t[:24] for t in truth[: len(prompts)]]
    # exactly the right drafts were accepted: not one more (a wrong token), not one fewer
    assert rows.stats.accepted_drafts == drafter.correct
    if wrong == 0.0:
        assert rows.stats.tokens_per_forward > 2.0


def spec_cfg(cache, **kw):
    base = dict(mode="spec", block_size=4, tau=1.0, draft_tokens=3, cache=cache, max_new_tokens=24, draft_groups="all")
    base.update(kw)
    return DecodeConfig(**base)


@pytest.mark.parametrize("cache,B,draft_B", [("cursor", 1, 1), ("cursor", 4, 1), ("cursor", 4, 3), ("none", 4, 3)])
def test_spec_at_tau_one_is_ar(model, tokenizer, draft, cache, B, draft_B):
    prompts = BATCH if cache == "cursor" else BATCH[:3]
    want = ar_batch(model, tokenizer)[: len(prompts)]
    for drafter_model in (draft, model):  # mostly rejected, always accepted
        cfg = spec_cfg(cache, block_size=B, draft_block_size=draft_B, draft_tau=0.2)
        res = generate(model, tokenizer, prompts, cfg, draft_model=drafter_model)
        assert res.token_ids == want
        assert res.stats.draft_forwards > 0 and res.stats.drafted > 0
        if drafter_model is model and draft_B == 1:
            assert res.stats.accepted_drafts > 0.9 * res.stats.drafted
        assert generate(model, tokenizer, prompts[1:2], cfg, draft_model=drafter_model).token_ids == want[1:2]


def test_ar_draft_forwards_k_per_step(model, tokenizer, draft):
    res = generate(model, tokenizer, PROMPTS[:1], spec_cfg("cursor", draft_tokens=3), draft_model=draft)
    assert res.stats.draft_forwards == 3 * res.stats.forwards
    assert res.stats.drafted == 3 * res.stats.forwards


SPEC_SETTINGS = [
    dict(tau=0.5),
    dict(tau=0.5, draft_groups="last", draft_is_target=True),
    dict(tau=0.4, draft_groups="ends", temperature=0.7),
    dict(tau=0.3, metric="probability", temperature=1.0),
    dict(tau=1.5, metric="entropy"),
    dict(tau=0.5, draft_block_size=3, draft_tau=0.3),
    dict(tau=0.7, draft_block_size=3, draft_tau=0.5, temperature=0.8, draft_tokens=5),
]


@pytest.mark.parametrize("kw", SPEC_SETTINGS)
def test_spec_mars_cursor_equals_reference_and_rows_alone(confident, tokenizer, draft, kw):
    kw = dict(kw)
    if kw.pop("draft_is_target", False):  # every draft accepted: the group after the last one is used
        draft = confident
    ref = generate(confident, tokenizer, BATCH, spec_cfg("none", max_new_tokens=16, **kw), draft_model=draft)
    assert any(c > 1 for step in ref.stats.accepted_per_step for c in step)
    res = generate(confident, tokenizer, BATCH, spec_cfg("cursor", max_new_tokens=16, **kw), draft_model=draft)
    assert res.token_ids == ref.token_ids
    assert res.stats.row_forwards == ref.stats.row_forwards
    assert res.stats.accepted_drafts == ref.stats.accepted_drafts
    assert res.stats.draft_forwards == ref.stats.draft_forwards
    for i in (0, 4, 7):
        alone = generate(confident, tokenizer, [BATCH[i]], spec_cfg("cursor", seed=i, max_new_tokens=16, **kw),
                         draft_model=draft)
        assert alone.token_ids[0] == ref.token_ids[i], i


@pytest.fixture(scope="module")
def confident(tokenizer):
    m = make_model("llama", len(tokenizer), seed=1, head_scale=60.0)
    m.generation_config.eos_token_id = tokenizer.eos_token_id
    return m


def test_lossless_sampling_cursor_equals_reference_and_rows_alone(confident_model, tokenizer):
    def run(prompts, cache, seed=3):
        cfg = DecodeConfig(mode="lossless", temperature=1.0, seed=seed, cache=cache, max_new_tokens=30)
        return generate(confident_model, tokenizer, prompts, cfg)

    ref = run(BATCH, "none")
    fast = run(BATCH, "cursor")
    assert fast.token_ids == ref.token_ids and fast.stats.accepted_drafts == ref.stats.accepted_drafts
    assert fast.stats.accepted_drafts > 0
    assert run([BATCH[4]], "cursor", seed=7).token_ids == [ref.token_ids[4]]


def test_tau_control_and_stop_in_spec(confident, tokenizer, draft):
    control = TauControl(1.0)
    counts = []
    cfg = spec_cfg("cursor", max_new_tokens=60)
    for ev in stream(confident, tokenizer, PROMPTS[1], cfg, control, draft_model=draft):
        counts.append(len(ev.tokens[0]) - ev.verified[0])  # tokens after the verified drafts
        if ev.step == 3:
            control.tau = 0.0
        assert ev.tau == (1.0 if ev.step <= 3 else 0.0)
    assert counts[:4] == [1] * 4 and max(counts[4:]) == 4
    for mode_cfg, d in ((cfg, draft), (DecodeConfig(mode="lossless", cache="cursor", max_new_tokens=60), None)):
        control = TauControl(1.0)
        events = []
        for ev in stream(confident, tokenizer, PROMPTS[0], mode_cfg, control, draft_model=d):
            events.append(ev)
            control.stop()
        assert len(events) == 1


def test_stream_events_add_up(confident, tokenizer, draft):
    cfg = spec_cfg("cursor", tau=0.5, max_new_tokens=40)
    events = list(stream(confident, tokenizer, PROMPTS[4], cfg, draft_model=draft))
    res = generate(confident, tokenizer, [PROMPTS[4]], cfg, draft_model=draft)
    assert [t for ev in events for t in ev.tokens[0]] == res.token_ids[0]
    assert sum(ev.verified[0] for ev in events) <= res.stats.accepted_drafts
    assert all(0 <= ev.verified[0] <= len(ev.tokens[0]) for ev in events)
    assert res.stats.tokens_per_target_forward == res.stats.tokens_per_forward > 1


def test_rows_finishing_at_different_steps(confident, tokenizer, draft):
    eos = tokenizer.eos_token_id
    full = generate(confident, tokenizer, BATCH, spec_cfg("cursor", tau=0.5, max_new_tokens=30), draft_model=draft).token_ids
    ar = ar_batch(confident, tokenizer, 30)
    confident.generation_config.eos_token_id = [eos, full[1][5], ar[2][7]]  # tokens rows produce mid-stream
    try:
        for kw in (dict(tau=0.5), dict(mode="lossless")):
            d = None if "mode" in kw else draft
            ref = generate(confident, tokenizer, BATCH, spec_cfg("none", max_new_tokens=30, **kw), draft_model=d)
            assert len({len(t) for t in ref.token_ids}) > 2
            res = generate(confident, tokenizer, BATCH, spec_cfg("cursor", max_new_tokens=30, **kw), draft_model=d)
            assert res.token_ids == ref.token_ids
    finally:
        confident.generation_config.eos_token_id = eos


@pytest.mark.parametrize("kwargs,match", [
    (dict(draft_tokens=0), "draft_tokens must be >= 1"),
    (dict(draft_tokens=33), "draft_tokens must be <= 32"),
    (dict(draft_tokens=2.0), "integer"),
    (dict(draft_block_size=0), "draft_block_size"),
    (dict(draft_tau=1.5), r"\[0, 1\]"),
    (dict(mode="lossless", cache="sliding"), "cache='cursor'"),
    (dict(draft_groups="some"), "draft_groups"),
    (dict(mode="spec", cache="block"), "cache='cursor'"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DecodeConfig(**kwargs)


def test_default_cache_follows_the_mode():
    assert DecodeConfig(mode="lossless").cache == DecodeConfig(mode="spec").cache == "cursor"
    assert DecodeConfig().cache == DecodeConfig(mode="ar").cache == "sliding"
    assert DecodeConfig(mode="lossless", cache="none").cache == "none"


def test_bad_draft_models(model, tokenizer, draft):
    with pytest.raises(ValueError, match="needs a draft model"):
        generate(model, tokenizer, PROMPTS[:1], spec_cfg("cursor"))
    for mode in ("ar", "mars"):
        with pytest.raises(ValueError, match="only used by mode='spec'"):
            generate(model, tokenizer, PROMPTS[:1], DecodeConfig(mode=mode), draft_model=draft)
    with pytest.raises(ValueError, match="only used by mode='spec'"):
        generate(model, tokenizer, PROMPTS[:1], DecodeConfig(mode="lossless", cache="cursor"), draft_model=draft)
    other = make_model("qwen2", 100, seed=3)
    with pytest.raises(ValueError, match="vocabulary"):
        generate(model, tokenizer, PROMPTS[:1], spec_cfg("cursor"), draft_model=other)
    with pytest.raises(ValueError, match="causal LM"):
        generate(model, tokenizer, PROMPTS[:1], spec_cfg("cursor"), draft_model="Qwen/Qwen2.5-0.5B")


def test_padded_draft_vocabulary_is_accepted(model, tokenizer):
    """Same tokenizer, embedding padded to another size (as Qwen2.5 0.5B vs 7B): allowed, exact."""
    from mars_core.speculative import check_draft_model

    wide = make_model("qwen2", len(tokenizer) + 37, seed=2, head_scale=30.0)
    mask_id = special_ids(model, tokenizer)[0]
    try:
        check_draft_model(model, wide, tokenizer, spec_cfg("cursor"), mask_id)
    except ValueError as e:
        pytest.fail(f"a draft whose embedding is only padded was refused: {e}")
    res = generate(model, tokenizer, PROMPTS[:2], spec_cfg("cursor"), draft_model=wide)
    assert res.token_ids == [hf_greedy(model, tokenizer, p, 24) for p in PROMPTS[:2]]


def test_every_drafter_implements_the_protocol(model, tokenizer):
    from mars_core.drafter import Drafter, SelfDrafter
    from mars_core.speculative import ModelDrafter
    from mars_core.verify_forward import NoCacheContext

    cfg = spec_cfg("none")
    ids = [encode_prompt(tokenizer, p) for p in BATCH[:2]]
    mask_id, pad_id, stop = special_ids(model, tokenizer)
    rows = Rows(ids, cfg, TauControl(cfg.tau, cfg.metric), stop, "cpu")
    drafters = [SelfDrafter(2, 3), ModelDrafter(NoCacheContext(model, 2, mask_id, pad_id, "cpu"), rows, 3, 300),
                AdversarialDrafter(rows, [[1]] * 2, 0.0, 0.0, 300)]
    assert all(isinstance(d, Drafter) for d in drafters)
    with pytest.raises(ValueError, match="must implement mars_core.drafter.Drafter"):
        next(decode_exact(model, rows, mask_id, pad_id, drafter=object()))


def test_a_smaller_draft_vocabulary_never_proposes_the_ids_it_lacks():
    """The draft's logits over the target's ids: its own, then ids it cannot propose (-inf: zero
    probability greedy or sampled); a larger draft vocabulary is cut to the target's."""
    from mars_core.speculative import fit_vocab

    logits = torch.tensor([[[-5.0, -4.0, -3.0]]])  # every logit below 0
    wide = fit_vocab(logits, 5)
    assert wide.shape == (1, 1, 5) and torch.equal(wide[..., :3], logits)
    assert torch.isneginf(wide[..., 3:]).all()
    assert wide.argmax(-1).item() == 2 and torch.softmax(wide, -1)[..., 3:].sum() == 0
    assert torch.equal(fit_vocab(torch.arange(6.0).reshape(1, 1, 6), 4), torch.arange(4.0).reshape(1, 1, 4))
