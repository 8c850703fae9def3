"""`fastest_exact`: the exact (greedy lossless) configuration that is fastest on this machine.

Two measurements, each made once and kept on disk:

- what a forward costs here: c(W) / c(1) for a forward of W new tokens over a few hundred cached
  ones against one AR token's (a mask-gated model's runs the base's layers alone), for this model,
  dtype, device and thread count (`forward_costs`); on a CPU with native bf16 a 12-token forward of
  a plain model costs about 1.2x a 1-token one, in fp32 on AVX2 1.2-1.3x, and a gate adds its own;
- what the drafts would accept: the model's greedy AR output on sample prompts, and the top-k
  candidates of a group of masks after every position of it (one forward per prompt). Since every
  exact decode's output is that AR output and its drafts depend only on it, each candidate
  configuration is replayed without decoding (`replay`): the forwards it would take and the width
  of each.

The modelled speed-up of a configuration is AR's cost (one 1-token forward of the base per token)
over the sum of its forwards' costs; the fastest wins. Prompt lookup is always on (it only ever adds
verified drafts where the text repeats), and the candidates are the lossless chain (groups after
the last draft, and after every draft) and drafts planned per step under budgets of 4 to 24 nodes.
Where none is modelled faster than AR (a batch whose one-token forward is already wide enough to
fill the machine, masks that guess little), the answer is AR itself: it is exact too, and "fastest"
should never be slower than the plain decode (a compiled AR decode of a mask-gated model runs the
base's layers alone: `gate.no_masks`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .config import DecodeConfig
from .timing import cached, machine_key, timed_widths
from .draft_plan import Candidates, Planner, budget
from .prompts import encode_prompt, special_ids
from .tree import chain

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SAMPLE_PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that returns the n-th Fibonacci number, and explain it.",
    "A shop sells pens at 3 dollars each. How much do 14 pens cost? Show your steps.",
    "List five tips for writing a clear email, one line each.",
    "Summarise the plot of a story about a lost dog finding its way home.",
    "What are the differences between a list and a tuple in Python?",
)
WIDTHS = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 64)
BUDGETS = ((4, 1), (4, 2), (6, 1), (6, 2), (8, 2), (8, 3), (10, 2), (10, 3), (12, 3), (16, 3), (16, 4), (24, 4))
TOP_K = 8


@torch.no_grad()
def forward_costs(model: PreTrainedModel, batch: int = 1, context: int = 256, repeats: int = 5,
                  widths: tuple[int, ...] = WIDTHS, cache: bool = True) -> dict[int, float]:
    """{W: c(W) / c(1)}: the median time of a forward of W new tokens over `context` cached ones,
    relative to one token's, which is what an AR step pays (kept on disk per `machine_key`).

    A window's tail holds masks, as a step's does, so a mask-gated model's windows pay its adapters;
    its one-token forward holds none and runs the base's layers alone (`gate`: a forward without
    masks skips the adapters), so the unit is the base's AR step. Before, every forward ran the
    adapters and c(1) was ~1.2x the base's in eager bf16 here, which flattered every candidate.
    Rounds rotate the widths (the first a warm-up), so a slow spell of the machine lands on all
    of them rather than on one."""
    def measure() -> dict[str, float]:
        times = timed_widths(model, batch, context, repeats, tuple(sorted({1, *widths})))
        return {str(w): t / times[1] for w, t in times.items()}

    curve = cached("costs", machine_key(model, batch), measure) if cache else measure()
    return {int(w): c for w, c in curve.items()}


def cost_at(curve: dict[int, float], width: int) -> float:
    """c(width) / c(1), linear between the measured widths (beyond the last: its slope)."""
    ws = sorted(curve)
    if width in curve:
        return curve[width]
    lo = max((w for w in ws if w < width), default=ws[0])
    hi = min((w for w in ws if w > width), default=None)
    if hi is None:
        lo, hi = ws[-2], ws[-1]
    return curve[lo] + (curve[hi] - curve[lo]) * (width - lo) / (hi - lo)


@dataclass(frozen=True)
class Sample:
    """One prompt's greedy AR continuation and the mask candidates after every position of it."""

    text: tuple[int, ...]  # prompt + AR output (+ the stop token that ended it)
    first: int  # index of the prompt's last token
    ids: tuple  # (len(text) - first, B - 1, k): after text[:t + 1], row t - first
    probs: tuple


@torch.no_grad()
def sample(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], block_size: int,
           max_new_tokens: int) -> list[Sample]:
    """The AR outputs of `prompts` and one forward each with a group of masks after every position."""
    from .generate import generate

    mask_id, _, stop = special_ids(model, tokenizer)
    out = generate(model, tokenizer, list(prompts), DecodeConfig(mode="ar", cache="cursor", max_new_tokens=max_new_tokens))
    samples = []
    for prompt, ids in zip(prompts, out.token_ids):
        p = encode_prompt(tokenizer, prompt)
        text = p + ids + ([stop[0]] if len(ids) < max_new_tokens and stop else [])
        samples.append(sample_of(model, text, len(p) - 1, mask_id, block_size))
    return samples


@torch.no_grad()
def sample_of(model: PreTrainedModel, text: list[int], first: int, mask_id: int, block_size: int) -> Sample:
    """The candidates of a group of masks after every position of `text` from `first` on, one forward."""
    dev = next(model.parameters()).device
    M = block_size - 1
    pattern, pos = chain(len(text) - first - 1, M).window(first)
    x = torch.tensor([list(text) + [mask_id] * ((len(text) - first) * M)], device=dev)
    logits = model(input_ids=x, attention_mask=pattern[None, None].to(dev), position_ids=pos[None].to(dev),
                   logits_to_keep=torch.arange(len(text), x.shape[1], device=dev)).logits[0]
    top = torch.softmax(logits.float(), -1).topk(TOP_K, dim=-1)
    shape = (len(text) - first, M, TOP_K)
    return Sample(tuple(text), first, tuple(map(tuple, top.indices.view(shape).tolist())),
                  tuple(map(tuple, top.values.view(shape).tolist())))


def replay(s: Sample, cfg: DecodeConfig) -> list[int]:
    """The window width of every forward a greedy lossless decode of `cfg` takes on the sample
    (its output is the sample's text): the decoder's planner, its acceptance rule, no model."""
    planner = Planner(cfg)
    _, _, _, k = budget(cfg)
    M = cfg.block_size - 1
    widths = [s.first + 1 + M]  # the first forward: the prompt and one group after it
    root, cands, copied = s.first + 1, _cands(s, s.first, k), False  # root: the last emitted token
    while root < len(s.text) - 1:
        plan = planner.plan(cands, list(s.text[:root + 1]), copied)
        node, j = 0, 0
        tokens, parents = plan.tokens, plan.shape.parents
        while root + 1 + j < len(s.text):  # the longest path the AR output confirms
            child = next((v for v in range(1, len(tokens) + 1)
                          if parents[v - 1] == node and tokens[v - 1] == s.text[root + 1 + j]), None)
            if child is None:
                break
            node, j = child, j + 1
        widths.append(1 + plan.shape.size + len(plan.shape.group_nodes) * M)
        cands = _cands(s, root + j, k) if node in plan.shape.group_nodes else Candidates()
        copied = plan.copied
        root += j + 1
    return widths


def _cands(s: Sample, last: int, k: int) -> Candidates:
    """The candidates of the group after text[:last + 1] (none past the text's end)."""
    row = last - s.first
    if row >= len(s.ids):
        return Candidates()
    return Candidates(tuple(ids[:k] for ids in s.ids[row]), tuple(p[:k] for p in s.probs[row]))


def candidates(block_size: int, lookup_tokens: int | None = None) -> list[DecodeConfig]:
    """The configurations `fastest_exact` weighs: the chain ("last", "all") and the budgets."""
    common = dict(mode="lossless", block_size=block_size, prompt_lookup=2, prompt_lookup_tokens=lookup_tokens)
    out = [DecodeConfig(**common, draft_groups=g) for g in ("last", "all")]
    return out + [DecodeConfig(**common, draft_budget=b) for b in BUDGETS]


def modelled_speedup(samples: list[Sample], cfg: DecodeConfig, curve: dict[int, float]) -> tuple[float, float]:
    """(speed-up over AR, tokens per forward) of `cfg` on the samples, from the replay and the costs.
    The prompt's own forward is left out of both sides (every decoder pays it)."""
    ar = cost = tokens = forwards = 0.0
    for s in samples:
        widths = replay(s, cfg)[1:]
        n = len(s.text) - s.first - 2  # tokens after the first forward's
        ar += n  # the curve's unit: one AR token
        cost += sum(cost_at(curve, w) for w in widths)
        tokens, forwards = tokens + n, forwards + len(widths)
    return (ar / cost if cost else 1.0), (tokens / forwards if forwards else 1.0)


def fastest_exact(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, prompts: list[str] | None = None,
                  block_size: int | None = None, batch_size: int = 1, max_new_tokens: int = 96,
                  compile: bool | str = False, lookup_tokens: int | None = 10,
                  report: dict | None = None) -> DecodeConfig:
    """The greedy exact `DecodeConfig` with the highest modelled speed-up over AR on this machine: a
    lossless MARS configuration, or AR itself where none is modelled faster (either way its output is
    the model's greedy AR output, token for token). `prompts`: text like what it
    will decode (default: a few instructions); `report`, if given, receives every candidate's
    modelled speed-up and tokens per forward, and the cost curve."""
    from .loading import trained_block_size

    B = block_size or trained_block_size(model) or 4
    curve = forward_costs(model, batch_size)
    samples = sample(model, tokenizer, list(prompts or SAMPLE_PROMPTS), B, max_new_tokens)
    ar = DecodeConfig(mode="ar", block_size=B, cache="cursor")
    scored = [((1.0, 1.0), ar)] + [(modelled_speedup(samples, config, curve), config)
                                   for config in candidates(B, lookup_tokens)]
    (best, tpf), cfg = max(scored, key=lambda x: x[0][0])  # a tie with AR goes to AR: it is listed first
    if report is not None:
        report.update(costs=curve, candidates=[dict(config=_name(config), speedup=round(s, 3), tokens_per_forward=round(t, 3))
                                               for (s, t), config in scored])
    return DecodeConfig(**{**cfg.__dict__, "compile": compile, "max_new_tokens": max_new_tokens})


def _name(cfg: DecodeConfig) -> str:
    if cfg.mode == "ar":
        return "AR, no drafts"
    if cfg.draft_budget is not None:
        return f"budget {cfg.draft_budget[0]} nodes, {cfg.draft_budget[1]} groups"
    return f"chain, groups {cfg.draft_groups}"
