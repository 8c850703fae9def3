"""The draft model of `mode="spec"`: checks, and K proposals per step with its own context.

Any causal LM with the target's tokenizer can draft. It proposes `draft_tokens` (K) tokens per
step, AR (`draft_block_size` 1: K forwards) or with MARS (`draft_block_size` > 1: each forward
reads its block of predictions and keeps them left to right while the top-1 probability passes
`draft_tau`, so fewer forwards). Its context (`NoCacheContext` or `CursorContext`, the same as
the target's) holds the committed text; after the target's verification the rejected drafts are
rolled back (a cursor move, never a copy).

Exactness when sampling needs every draft to be drawn from the distribution q that the
verification divides by. A MARS draft keeps a prediction by a rule that looks at the
distribution only (its top-1 probability), never at the token drawn from it: the token is then
distributed exactly as q whether or not it is kept. (The usual "probability of the sampled
token" rule would bias q towards confident tokens and break the guarantee.)
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .acceptance import choose_tokens, passes

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from .config import DecodeConfig
    from .decoding import Rows
    from .verify_forward import CursorContext, NoCacheContext


def vocab_size(model: PreTrainedModel) -> int:
    """Ids the model's output covers: its LM head's rows (they may exceed the tokenizer's), else the config's."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def check_draft_model(model: PreTrainedModel, draft_model: PreTrainedModel | None,
                      tokenizer: PreTrainedTokenizerBase, cfg: DecodeConfig, mask_id: int) -> None:
    """Raise a ValueError unless `draft_model` can draft for `model` under `cfg`."""
    if cfg.mode != "spec":
        if draft_model is not None:
            raise ValueError(f"a draft model is only used by mode='spec', not mode={cfg.mode!r}; "
                             "drop draft_model or set mode='spec'")
        return
    if draft_model is None:
        raise ValueError("mode='spec' needs a draft model: pass draft_model=... (a causal LM with the target's tokenizer)")
    if not callable(draft_model) or not hasattr(draft_model, "config") or not hasattr(draft_model, "parameters"):
        raise ValueError(f"draft_model must be a causal LM (a transformers model), got {type(draft_model).__name__}")
    vt, vd, n_tok = vocab_size(model), vocab_size(draft_model), len(tokenizer)
    # embedding matrices may be padded past the tokenizer (the Qwen2.5 family: 151,936 vs
    # 152,064); a draft whose output cannot cover the tokenizer has another vocabulary
    if vd != vt and (vd < n_tok or vt < n_tok):
        raise ValueError(
            f"the draft model's vocabulary ({vd} ids) differs from the target's ({vt} ids, tokenizer "
            f"{n_tok}); the draft must use the target's tokenizer"
        )
    if cfg.draft_block_size > 1 and mask_id >= vd:
        raise ValueError(f"draft_block_size > 1 decodes the draft with MARS, but the mask id {mask_id} "
                         f"is outside the draft's vocabulary ({vd} ids)")
    dt = next(model.parameters()).device
    dd = next(draft_model.parameters()).device
    if dt != dd:
        raise ValueError(f"the draft model is on {dd} and the target on {dt}; put both on one device")


def fit_vocab(logits: torch.Tensor, V: int) -> torch.Tensor:
    """The draft's logits (..., Vd) over the target's V ids (..., V): cut, or extended with ids
    it never proposes (logit -inf)."""
    Vd = logits.shape[-1]
    if Vd > V:
        return logits[..., :V]
    if Vd < V:
        pad = logits.new_full(logits.shape[:-1] + (V - Vd,), float("-inf"))
        return torch.cat([logits, pad], dim=-1)
    return logits


class ModelDrafter:
    """K drafts per step from a draft model (a `drafter.Drafter`); `update` rolls back what the target rejected."""

    def __init__(self, context: NoCacheContext | CursorContext, rows: Rows, K: int, vocab: int):
        self.ctx, self.rows, self.K, self.V = context, rows, K, vocab
        cfg = rows.cfg
        self.B, self.tau, self.temperature = cfg.draft_block_size, cfg.draft_tau, cfg.temperature
        self.pending = [list(p) for p in rows.prompts]  # committed tokens not yet in the draft's context
        self.fed: list[int] = []  # per row: drafts of this step already in the draft's context

    @torch.no_grad()
    def propose(self) -> tuple[list[list[int]], torch.Tensor | None]:
        """Returns drafts (host lists of K ids per active row) and q (R, K, V) (None when greedy)."""
        R, K, rows = len(self.pending), self.K, self.rows
        drafts: list[list[int]] = [[] for _ in range(R)]
        last = [0] * R  # drafts from the latest forward (not yet in the context)
        q = torch.zeros(R, K, self.V, device=rows.device) if self.temperature > 0 else None
        feed = self.pending
        while True:
            need = [i for i in range(R) if len(drafts[i]) < K]
            if not need:
                break
            feed = [f if i in need else [] for i, f in enumerate(feed)]
            verify, masks, _ = self.ctx.forward(feed, [[] for _ in range(R)], self.B)
            rows.stats.draft_forwards += 1
            logits = fit_vocab(torch.cat([verify, masks[:, 0]], dim=1), self.V)  # (R, Bd, V)
            sel = torch.tensor(need, device=rows.device)
            noise = None
            if self.temperature > 0:
                noise = rows.random.noise([rows.active[i] for i in need], self.B, self.V)
            tokens, probs = choose_tokens(logits[sel], self.temperature, noise)  # (N, Bd), (N, Bd, V)
            ok = passes(probs.max(dim=-1).values, self.tau, "probability")
            ok[:, 0] = True
            n_keep = ok.long().cumprod(dim=1).sum(dim=1)
            packed = torch.cat([tokens, n_keep[:, None]], dim=1).tolist()
            feed = [[] for _ in range(R)]
            for a, (i, row) in enumerate(zip(need, packed)):
                take = min(int(row[-1]), K - len(drafts[i]))
                if q is not None:
                    q[i, len(drafts[i]):len(drafts[i]) + take] = probs[a, :take]
                drafts[i] += row[:take]
                feed[i], last[i] = row[:take], take
        self.fed = [K - t for t in last]
        return drafts, q

    def update(self, j: list[int], emitted: list[list[int]], drafts: list[list[int]] | None = None,
               q: torch.Tensor | None = None) -> None:
        """The target accepted j[i] drafts of row i and emitted `emitted[i]` (drafts included);
        the target's own next drafts (`drafts`, `q`) are not used: this drafter has a model."""
        kept = [min(a, f) for a, f in zip(j, self.fed)]
        self.ctx.rollback([f - k for f, k in zip(self.fed, kept)])
        self.pending = [e[k:] for e, k in zip(emitted, kept)]

    def select(self, keep: list[int]) -> None:
        """Keep only the rows `keep` (indices into the active rows), in that order."""
        self.ctx.select(keep)
        self.pending = [self.pending[i] for i in keep]
