"""The frozen-lower-layers MARS loss against `mars_loss` on the full [noisy | clean] layout."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mars_core.loss import IGNORE, mars_loss
from training.frozen_layers import compact_inputs, lower_hidden, trainable_upper, upper_loss

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


def test_gradients_reach_only_the_upper_layers():
    model = tiny_llama()
    params = trainable_upper(model, 2)
    c = compact_inputs(list(range(10, 26)), 6, 4, MASK)
    noisy, clean = upper_loss(model, lower_hidden(model, c, 2), c, 2)
    (noisy + clean).backward()
    assert all(p.grad is not None for p in params)
    assert all(p.grad is None for p in model.model.layers[:2].parameters())
    assert model.model.embed_tokens.weight.grad is None


def test_response_must_start_inside():
    with pytest.raises(ValueError, match="response must start"):
        compact_inputs([1, 2, 3], 3, 4, MASK)
