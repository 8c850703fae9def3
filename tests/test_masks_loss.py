"""The MARS training mask and loss against the rules of the spec (section 2)."""
import pytest
import torch

from conftest import make_model
from mars_core import mars_loss, mars_training_mask
from mars_core.loss import IGNORE, mars_inputs
from mars_core.masks import attention_of


def brute_force_mask(n: int, B: int) -> torch.Tensor:
    m = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    for q in range(2 * n):
        for k in range(2 * n):
            q_noisy, k_noisy = q < n, k < n
            qp, kp = q % n, k % n
            if not q_noisy and not k_noisy:
                m[q, k] = kp <= qp
            elif q_noisy and k_noisy:
                m[q, k] = kp // B == qp // B and kp <= qp
            elif q_noisy and not k_noisy:
                m[q, k] = kp // B < qp // B
    return m


@pytest.mark.parametrize("n,B", [(1, 1), (5, 1), (8, 4), (9, 4), (12, 3), (16, 16), (7, 8)])
def test_mask_equals_the_four_rules(n, B):
    assert torch.equal(mars_training_mask(n, B), brute_force_mask(n, B))


def test_mask_example_from_the_spec():
    m = mars_training_mask(8, 4)
    noisy_to_clean = m[:8, 8:]
    assert not noisy_to_clean[:4].any()  # block 0 sees nothing clean
    assert noisy_to_clean[4:, :4].all() and not noisy_to_clean[4:, 4:].any()


def batch(tokenizer, n_rows=3, n=14, seed=0, prompt=5):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, len(tokenizer), (n_rows, n), generator=g)
    labels = ids.clone()
    labels[:, :prompt] = IGNORE
    return ids, labels


def test_clean_half_equals_a_plain_causal_forward(model, tokenizer):
    ids, labels = batch(tokenizer)
    x, mask, pos = mars_inputs(ids, labels, torch.ones_like(ids), 4, tokenizer.mask_token_id)
    with torch.no_grad():
        mars = model(input_ids=x, attention_mask=mask, position_ids=pos).logits
        plain = model(input_ids=ids).logits
    torch.testing.assert_close(mars[:, ids.shape[1]:], plain, atol=1e-5, rtol=1e-5)


def test_noisy_predictions_never_see_the_current_or_later_clean_blocks(model, tokenizer):
    B, n = 4, 16
    ids, labels = batch(tokenizer, n=n, prompt=1)  # position 1 is a response token
    mid = tokenizer.mask_token_id

    def noisy_logits(x):
        a, mask, pos = mars_inputs(x, labels, torch.ones_like(x), B, mid)
        with torch.no_grad():
            return model(input_ids=a, attention_mask=mask, position_ids=pos).logits[:, :n]

    base = noisy_logits(ids)
    for k in range(n // B):
        changed = ids.clone()
        changed[:, k * B + 1] = (changed[:, k * B + 1] + 7) % len(tokenizer)  # a response token of block k
        after = noisy_logits(changed)
        upto = (k + 1) * B  # noisy positions of blocks <= k
        torch.testing.assert_close(after[:, :upto], base[:, :upto], atol=0, rtol=0)
        if k + 1 < n // B:
            assert not torch.allclose(after[:, upto:], base[:, upto:])


def test_right_padding_never_changes_the_loss(model, tokenizer):
    ids, labels = batch(tokenizer, n_rows=2, n=12)
    mid = tokenizer.mask_token_id
    pad = torch.full((2, 5), tokenizer.pad_token_id)
    padded = torch.cat([ids, pad], 1)
    padded_labels = torch.cat([labels, torch.full_like(pad, IGNORE)], 1)
    attn = torch.cat([torch.ones_like(ids), torch.zeros_like(pad)], 1)
    with torch.no_grad():
        a = mars_loss(model, ids, labels, block_size=4, mask_token_id=mid)
        b = mars_loss(model, padded, padded_labels, attn, block_size=4, mask_token_id=mid)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


def test_loss_parts_and_ar_weight(model, tokenizer):
    ids, labels = batch(tokenizer)
    mid = tokenizer.mask_token_id
    with torch.no_grad():
        full = mars_loss(model, ids, labels, block_size=4, mask_token_id=mid)
        ablation = mars_loss(model, ids, labels, block_size=4, mask_token_id=mid, ar_weight=0.0)
        plain = model(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(full.total, full.noisy + full.clean)
    torch.testing.assert_close(ablation.total, ablation.noisy)
    torch.testing.assert_close(full.clean, plain, atol=1e-5, rtol=1e-5)  # clean half = SFT loss


def test_loss_rejects_bad_input(model, tokenizer):
    ids, labels = batch(tokenizer)
    with pytest.raises(ValueError, match="block_size"):
        mars_loss(model, ids, labels, block_size=0, mask_token_id=4)
    with pytest.raises(ValueError, match="differ"):
        mars_loss(model, ids, labels[:, :-1], block_size=4, mask_token_id=4)


def _eager_and_sdpa(tokenizer):
    eager = make_model("qwen2", len(tokenizer))
    eager.set_attn_implementation("eager")
    sdpa = make_model("qwen2", len(tokenizer))  # same seed: the same weights
    assert attention_of(eager) == "eager" and attention_of(sdpa) == "sdpa"
    return eager, sdpa


def test_eager_attention_adds_a_boolean_mask_instead_of_applying_it(tokenizer):
    """Why `mars_loss` converts the mask: eager attention adds the mask to the scores."""
    eager, sdpa = _eager_and_sdpa(tokenizer)
    ids, labels = batch(tokenizer)
    x, mask, pos = mars_inputs(ids, labels, torch.ones_like(ids), 4, tokenizer.mask_token_id)
    with torch.no_grad():
        wrong = eager(input_ids=x, attention_mask=mask, position_ids=pos).logits
        right = sdpa(input_ids=x, attention_mask=mask, position_ids=pos).logits
    assert (wrong - right).abs().max() > 1e-2


def test_mars_loss_is_the_same_under_eager_and_sdpa(tokenizer):
    eager, sdpa = _eager_and_sdpa(tokenizer)
    ids, labels = batch(tokenizer)
    pad = torch.full((3, 4), tokenizer.pad_token_id)  # right padding too: masked keys must stay masked
    ids, labels = torch.cat([ids, pad], 1), torch.cat([labels, torch.full_like(pad, IGNORE)], 1)
    attn = torch.cat([torch.ones(3, 14, dtype=torch.long), torch.zeros_like(pad)], 1)
    with torch.no_grad():
        a = mars_loss(eager, ids, labels, attn, block_size=4, mask_token_id=tokenizer.mask_token_id)
        b = mars_loss(sdpa, ids, labels, attn, block_size=4, mask_token_id=tokenizer.mask_token_id)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


class Wrapped(torch.nn.Module):
    """Like DistributedDataParallel: the model is `.module`, with no `config` of its own."""

    def __init__(self, model):
        super().__init__()
        self.module = model

    def forward(self, **kwargs):
        return self.module(**kwargs)


def test_mars_loss_looks_through_a_wrapper(tokenizer):
    eager, sdpa = _eager_and_sdpa(tokenizer)
    ids, labels = batch(tokenizer)
    with torch.no_grad():
        a = mars_loss(Wrapped(eager), ids, labels, block_size=4, mask_token_id=tokenizer.mask_token_id)
        b = mars_loss(sdpa, ids, labels, block_size=4, mask_token_id=tokenizer.mask_token_id)
    torch.testing.assert_close(a.total, b.total, atol=1e-5, rtol=1e-5)


def test_attention_that_cannot_take_the_mask_is_refused(tokenizer):
    m = make_model("qwen2", len(tokenizer))
    m.config._attn_implementation = "flash_attention_2"  # no kernel needed: refused before any forward
    ids, labels = batch(tokenizer)
    with pytest.raises(ValueError, match="attn_implementation is 'flash_attention_2'"):
        mars_loss(m, ids, labels, block_size=4, mask_token_id=tokenizer.mask_token_id)


def test_decoders_refuse_eager_attention(tokenizer):
    from mars_core import DecodeConfig, generate

    eager, _ = _eager_and_sdpa(tokenizer)
    with pytest.raises(ValueError, match="attn_implementation=\"sdpa\", the model has 'eager'"):
        generate(eager, tokenizer, ["Hi", "Tom has 12 apples."], DecodeConfig(tau=0.5, max_new_tokens=4))
