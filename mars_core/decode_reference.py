"""MARS without a KV cache: the slow, obviously correct reference.

Every step re-runs the whole sequence: prompt + generated tokens + B [MASK] tokens, and reads
the B predictions for the mask positions (right-shifted: the first comes from the last real
token). Sequences of a batch are left-padded to a common length, so the B predictions sit at
the same columns for every row. The fast decoders are tested against this one token for token.
"""
from __future__ import annotations

from typing import Iterator, TYPE_CHECKING

import torch

from .decoding import Rows, StepEvent, left_pad, positions
from .masks import causal_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@torch.no_grad()
def decode_reference(model: PreTrainedModel, rows: Rows, mask_id: int, pad_id: int) -> Iterator[StepEvent]:
    """Yield one `StepEvent` per forward until every row of `rows` stops; the tokens land in
    `rows.out`. model: a causal LM under sdpa attention; each forward reads logits (R, B, V) for
    the R rows still decoding. mask_id: the [MASK] id; pad_id: fills slots no query attends to."""
    B = rows.block
    while rows.running():
        tau = rows.tau()
        live = rows.active
        seqs = [rows.prompts[r] + rows.out[r] + [mask_id] * B for r in live]
        ids, valid = left_pad(seqs, pad_id, rows.device)
        mask = causal_mask(valid, ids.shape[1])
        # keep B + 1 positions: the last real token and the B masks; the last mask's own
        # prediction (for the position after the block) is not used
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(valid),
                       logits_to_keep=B + 1).logits[:, :B]  # (R, B, V)
        tokens, conf, n_acc = rows.accept(logits, live, tau)
        event = rows.commit(live, tokens, conf, n_acc, tau).event
        rows.still_active()
        yield event
