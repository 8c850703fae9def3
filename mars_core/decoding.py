"""What every decoder shares: per-sequence bookkeeping, step events and statistics.

A decoder owns the model calls and the KV cache; `Rows` owns everything a caller sees: the
generated ids, when a sequence stops (EOS or `max_new_tokens`), the counts behind tokens per
forward, and the per-step events a streaming caller reads. `Rows.commit` moves one step's
acceptance to the host with a single sync and returns what the step decided (`Outcome`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .acceptance import accept
from .config import DecodeConfig, TauControl


@dataclass
class DecodeStats:
    """Counts of one decode. `tokens` excludes EOS and prompt tokens.

    forwards:          decode forwards (model calls that produced tokens)
    prefill_forwards:  forwards that only filled the KV cache with the prompt
    row_forwards:      sum over forwards of the sequences that were decoding in it (an idle or
                       finished sequence in a batch is not counted); equals `forwards` at batch 1
    accepted_per_step: for every forward, the tokens each sequence accepted (0: not decoding)
    drafted:           drafts verified ("lossless", "spec"), summed over sequences
    accepted_drafts:   of those, the drafts the verification accepted
    draft_forwards:    forwards of the draft model ("spec")
    """

    forwards: int = 0
    prefill_forwards: int = 0
    tokens: int = 0
    row_forwards: int = 0
    seconds: float = 0.0
    accepted_per_step: list[list[int]] = field(default_factory=list)
    drafted: int = 0
    accepted_drafts: int = 0
    draft_forwards: int = 0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens per forward per sequence (the paper's T/F); in "spec", per target forward."""
        return self.tokens / self.row_forwards if self.row_forwards else 0.0

    @property
    def tokens_per_target_forward(self) -> float:
        """The same figure under the name speculative decoding uses (draft forwards not counted)."""
        return self.tokens_per_forward

    @property
    def draft_acceptance(self) -> float:
        """Share of the verified drafts that were accepted."""
        return self.accepted_drafts / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def idle_slots(self) -> int:
        """Forwards in which a sequence that had not finished accepted nothing (it waited, e.g.
        at a block-cache boundary for the others); the forwards after its last token do not count."""
        idle = 0
        for i in range(len(self.accepted_per_step[0]) if self.accepted_per_step else 0):
            col = [step[i] for step in self.accepted_per_step]
            last = max((k for k, v in enumerate(col) if v > 0), default=-1)
            idle += sum(1 for v in col[:last] if v == 0)
        return idle

    def per_sequence(self, i: int) -> list[int]:
        """Accepted counts of sequence `i` over the steps in which it decoded."""
        return [step[i] for step in self.accepted_per_step if step[i] > 0]


@dataclass
class StepEvent:
    """One forward of a decode, as a streaming caller sees it (batch of one: use index 0)."""

    step: int  # 0-based forward index
    tokens: list[list[int]]  # per sequence: ids accepted in this step (EOS excluded)
    confidences: list[list[float]]  # per sequence: their confidences under the metric
    finished: list[bool]  # per sequence: has it stopped (now or before)?
    forwards: int  # decode forwards so far
    generated: int  # tokens generated so far, all sequences
    elapsed: float  # seconds since the decode started, prefill included
    tau: float  # the threshold this step used
    # per sequence: all B predictions of this forward and their confidences, accepted or not
    # (empty for a sequence that did not decode in it); what a step-by-step replay shows. The
    # exact modes ("lossless", "spec") have no single block of B: there, the emitted tokens only
    proposed: list[list[int]] = field(default_factory=list)
    proposed_confidences: list[list[float]] = field(default_factory=list)
    # per sequence, how many of `tokens` are verified drafts (they come first); the next one is
    # the model's own AR token and any after it were accepted by tau. None: no drafts in this mode
    verified: list[int] | None = None


class RowRandom:
    """One random stream per sequence, so a batch samples exactly what each row samples alone.

    Sequence i of a batch is seeded with `seed + i`.
    """

    def __init__(self, n: int, seed: int, device: torch.device | str):
        self.gens = [torch.Generator(device=device).manual_seed(seed + i) for i in range(n)]
        self.device = device

    def noise(self, rows: list[int], block: int, vocab: int) -> torch.Tensor:
        """Uniform (0, 1) noise (len(rows), block, vocab), each row from its own stream."""
        draws = [torch.rand(block, vocab, generator=self.gens[r], device=self.device) for r in rows]
        return torch.stack(draws)  # (len(rows), B, V)


class Rows:
    """The sequences of one decode. `active` lists, in batch order, the original indices of the
    sequences still decoding; decoders keep their tensors in that order."""

    def __init__(self, prompts: list[list[int]], cfg: DecodeConfig, control: TauControl,
                 stop_ids: list[int], device):
        self.prompts = prompts
        self.cfg = cfg
        self.control = control
        self.device = device
        n = len(prompts)
        self.out: list[list[int]] = [[] for _ in range(n)]
        self.conf: list[list[float]] = [[] for _ in range(n)]
        self.finished = [False] * n
        self.stop_token: list[int | None] = [None] * n  # the stop id that ended a sequence, if one did
        self.active = list(range(n))
        self.stats = DecodeStats()
        self.stop_ids = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=device)
        self.random = RowRandom(n, cfg.seed, device) if cfg.temperature > 0 else None
        self.t0 = time.perf_counter()

    @property
    def block(self) -> int:
        return self.cfg.effective_block_size

    def tau(self) -> float:
        return self.control.tau

    def accept(self, logits: torch.Tensor, rows: list[int],
               tau: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Acceptance for the sequences `rows` (original indices); logits (len(rows), B, V)."""
        noise = None
        if self.random is not None:
            noise = self.random.noise(rows, logits.shape[1], logits.shape[2])
        return accept(logits, tau, self.cfg.metric, self.cfg.temperature, noise, self.cfg.max_accept,
                      self.cfg.repeat_guard)

    def commit(self, rows: list[int], tokens: torch.Tensor, conf: torch.Tensor, n_accept: torch.Tensor, tau: float,
               extra: torch.Tensor | None = None) -> Outcome:
        """Record one forward for the decoding sequences `rows` (original indices).

        tokens, conf: (R, B); n_accept: (R,). Accepted tokens are cut at the first stop id and
        at `max_new_tokens`. `extra` (R, m), optional, travels to the host in the same sync and
        comes back in each `RowOutcome.extra`.
        """
        remaining = torch.tensor([self.cfg.max_new_tokens - len(self.out[r]) for r in rows],
                                 device=tokens.device)
        take, done = cut(tokens, n_accept, self.stop_ids, remaining)
        packed = pack(tokens, conf, take, done, extra).tolist()  # the one host sync
        return self.record(rows, packed, tau, tokens.shape[1])

    def record(self, rows: list[int], packed: list[list[float]], tau: float, B: int) -> Outcome:
        """The host half of `commit`: `packed` holds one `pack`ed row (block B) per sequence of `rows`."""
        outcomes = [unpack(row, B) for row in packed]
        counts = [0] * len(self.prompts)
        ev_tokens = [[] for _ in self.prompts]
        ev_conf = [[] for _ in self.prompts]
        proposed = [[] for _ in self.prompts]
        proposed_conf = [[] for _ in self.prompts]
        for r, o in zip(rows, outcomes):
            if o.done and len(o.taken) < self.cfg.max_new_tokens - len(self.out[r]):
                self.stop_token[r] = o.next_id  # done before the cap: a stop id ended it
            self.out[r].extend(o.taken)
            self.conf[r].extend(o.conf)
            ev_tokens[r], ev_conf[r] = o.taken, o.conf
            proposed[r], proposed_conf[r] = o.proposed, o.proposed_conf
            self.finished[r] = self.finished[r] or o.done
            counts[r] = max(len(o.taken), 1)  # a step that only emitted EOS still used the forward
        self.stats.forwards += 1
        self.stats.row_forwards += len(rows)
        self.stats.tokens += sum(len(t) for t in ev_tokens)
        self.stats.accepted_per_step.append(counts)
        self.stats.seconds = time.perf_counter() - self.t0
        event = StepEvent(self.stats.forwards - 1, ev_tokens, ev_conf, list(self.finished),
                          self.stats.forwards, self.stats.tokens, self.stats.seconds, tau, proposed, proposed_conf)
        return Outcome(event, outcomes)

    def running(self) -> bool:
        """Is there a sequence left to decode? A stopped control ends the decode here."""
        if self.control.stopped:
            self.finished = [True] * len(self.finished)
            self.active = []
        return bool(self.active)

    def still_active(self) -> list[int]:
        """Positions (in the current batch order) of the sequences that go on; updates `active`."""
        keep = [i for i, r in enumerate(self.active) if not self.finished[r]]
        self.active = [self.active[i] for i in keep]
        return keep


def cut(tokens: torch.Tensor, n_accept: torch.Tensor, stop_ids: torch.Tensor,
        remaining: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut each row's accepted tokens at its first stop id and at its remaining budget.

    tokens (R, B), n_accept (R,), remaining (R,) -> take (R,) tokens kept, done (R,) bool.
    """
    idx = torch.arange(tokens.shape[1], device=tokens.device)
    stop = torch.isin(tokens, stop_ids) & (idx[None] < n_accept[:, None])  # (R, B)
    hit = stop.any(dim=1)
    first_stop = torch.where(hit, stop.float().argmax(dim=1), n_accept)
    take = torch.minimum(first_stop, remaining)
    return take, hit | (take >= remaining)


@dataclass
class RowOutcome:
    """One row's part of a step, as the host reads it back (`unpack`)."""

    taken: list[int]  # the ids kept: accepted, cut at the first stop id and at the budget
    conf: list[float]  # their confidences
    done: bool  # the row stops here (a stop id, or the budget)
    next_id: int | None  # the prediction right after the kept ones (the stop id, when one ended the row)
    proposed: list[int]  # every prediction of the forward, kept or not
    proposed_conf: list[float]
    extra: list[float]  # the decoder's own columns (`pack`'s extra), empty if none


@dataclass
class Outcome:
    """What one step decided: the event a caller sees, and each decoding row's `RowOutcome`
    (in the order the step was given its rows)."""

    event: StepEvent
    rows: list[RowOutcome]

    @property
    def taken(self) -> list[list[int]]:
        """Per row, the ids to feed back."""
        return [o.taken for o in self.rows]


def pack(tokens: torch.Tensor, conf: torch.Tensor, take: torch.Tensor, done: torch.Tensor,
         extra: torch.Tensor | None = None) -> torch.Tensor:
    """One step's outcome as one tensor, so that the host reads it with a single sync:
    (R, 2B + 2 [+ m]) float64 = [tokens (B) | confidences (B) | take | done | extra (m), if any]
    (token ids are exact in float64)."""
    cols = [tokens.double(), conf.double(), take[:, None].double(), done[:, None].double()]
    if extra is not None:
        cols.append(extra.double())
    return torch.cat(cols, dim=1)


def unpack(row: list[float], B: int) -> RowOutcome:
    """One row of `pack`'s tensor, read on the host (block B)."""
    k, done = int(row[2 * B]), bool(row[2 * B + 1])
    if k == 0 and not done:  # the row would repeat this step forever
        raise RuntimeError("a decoding step took no token and did not finish: acceptance must always take "
                           "the first prediction")
    return RowOutcome([int(t) for t in row[:k]], row[B:B + k], done, int(row[k]) if k < B else None,
                      [int(t) for t in row[:B]], row[B:2 * B], row[2 * B + 2:])


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad to one length: ids (N, L) long and valid (N, L) bool."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            valid[i, width - len(s):] = True
    return ids.to(device), valid.to(device)


def positions(valid: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
    """Position ids of the valid slots: offset + rank among valid slots; 0 at padding."""
    pos = valid.long().cumsum(dim=1) - 1
    if offset is not None:
        pos = pos + offset[:, None]
    return torch.where(valid, pos, torch.zeros_like(pos))
