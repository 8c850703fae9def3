"""Continuous batching on the cursor KV cache: requests join and leave between forwards.

A `Batcher` holds a fixed number of `slots`: rows of one preallocated cursor KV buffer
(`decode_cursor.CursorCache`). Before every forward it admits waiting requests into free rows
(a new row starts at cursor 0 and writes its prompt with its first forward, so there is no
separate prefill and no other row waits for it), asks the tau policy for the next tau, runs ONE
forward of every running row at its own cursor (`decode_cursor.cursor_forward`), accepts per
row with that row's tau, and retires the rows that finished (EOS, `max_new_tokens`, stopped).

Why a fixed number of slots: the buffer is allocated once, so memory is known before the first
request and admission never stalls a running batch to copy a grown cache (a growing buffer
would copy every layer's key/values exactly when the load rises). Running rows are kept at the
top of the buffer: a forward of R rows reads rows [0, R) as views, so an idle slot costs memory
but no compute, and a finished row is refilled by moving the last running row into it (one row
copy per retirement, not a gather of the batch). Requests beyond the slots wait in a FIFO queue.

Guarantee (tested in fp32): every request's tokens equal that request decoded alone by
`generate` / `stream` (cursor cache, seed = its seed) with the tau values it was given at each
of its steps. When every running row is at the strictest tau (exactly one token per step), the
forward carries no masks at all: the first prediction, the only one read, is the same.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from .acceptance import accept
from .config import DecodeConfig, TauControl, _check_int, check_tau
from .decode_cursor import CursorCache, cursor_forward
from .decoding import RowRandom, cut, pack, unpack
from .masks import require_sdpa
from .prompts import context_limit, special_ids
from .tau_policy import FixedTau, Load

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MAX_LEN = 4096  # slots of buffer per row when the model declares no (smaller) context
REPLY_WINDOW = 32  # finished replies whose average length the policy sees


@dataclass
class Request:
    """One generation request.

    control: optional `TauControl`. Given, its tau is this request's tau at every step (a user's
    own slider) and its `stop()` ends the request; None, the batcher's policy sets its tau.
    """

    prompt_ids: list[int]
    max_new_tokens: int = 256
    seed: int = 0
    control: TauControl | None = None


@dataclass
class RequestEvent:
    """What one request got from one forward (the streaming view)."""

    request_id: int
    tokens: list[int]  # accepted this step, EOS excluded
    confidences: list[float]
    tau: float  # the tau this request used in this forward
    finished: bool


@dataclass
class BatchStep:
    """One forward of the batcher, as a serving loop sees it."""

    step: int
    tau: float  # the policy's tau for this forward
    waiting: int  # requests still queued after admission
    running: int  # rows in this forward
    seconds: float  # wall time of the whole step (admission, forward, acceptance, retirement)
    events: list[RequestEvent]
    admitted: list[int]  # request ids that joined the batch with this forward

    @property
    def tokens(self) -> int:
        return sum(len(e.tokens) for e in self.events)


@dataclass
class RequestState:
    """A request's progress; `taus` and `accepted` have one entry per forward it took part in."""

    request_id: int
    request: Request
    out: list[int] = field(default_factory=list)
    conf: list[float] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    finished: bool = False
    cursor: int = 0  # cached tokens (= next slot = next position id); a request is admitted once, at 0
    feed: list[int] = field(default_factory=list)  # real tokens not yet in the cache
    random: RowRandom | None = None


class Batcher:
    """Continuous batching of MARS requests on one model.

    config: block_size, metric, temperature, max_accept, repeat_guard, and the defaults of a `Request`'s tau
    (`FixedTau(config.tau)` when no policy is given). The cache mode is always the cursor cache.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: DecodeConfig,
                 slots: int = 8, policy: Callable[[Load], float] | None = None, max_len: int | None = None):
        if not isinstance(config, DecodeConfig):
            raise ValueError(f"config must be a DecodeConfig, got {type(config).__name__}")
        _check_int("slots", slots, 1)
        require_sdpa(model)
        limit = context_limit(model) or DEFAULT_MAX_LEN
        if max_len is None:
            max_len = min(limit, DEFAULT_MAX_LEN)
        _check_int("max_len", max_len, 2)
        self.model, self.cfg, self.slots, self.max_len = model, config, slots, max_len
        self.policy = policy if policy is not None else FixedTau(config.tau, config.metric)
        if getattr(self.policy, "metric", config.metric) != config.metric:
            raise ValueError(f"the policy's metric {self.policy.metric!r} differs from the config's {config.metric!r}")
        self.mask_id, self.pad_id, stop = special_ids(model, tokenizer)
        self.device = next(model.parameters()).device
        self.stop_ids = torch.tensor(stop, dtype=torch.long, device=self.device)
        self.B = config.effective_block_size
        self.cache = CursorCache(slots, max_len + 2 * self.B)
        self.waiting: deque[RequestState] = deque()
        self.live: list[RequestState] = []  # running requests; live[i] owns buffer row i
        self.done: dict[int, RequestState] = {}
        self.steps = 0
        self._next_id = 0
        self._last: tuple[float, float] | None = None  # (seconds, tokens per row) of the last step
        self._replies: deque[int] = deque(maxlen=REPLY_WINDOW)  # lengths of recent finished replies

    # ---------------------------------------------------------------------------------------
    def submit(self, request: Request) -> int:
        """Queue a request; returns its id. Raises ValueError for a request that cannot run."""
        if not isinstance(request, Request):
            raise ValueError(f"submit takes a Request, got {type(request).__name__}")
        ids = request.prompt_ids
        if not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("prompt_ids must be a non-empty list of token ids (ints)")
        _check_int("max_new_tokens", request.max_new_tokens, 1)
        _check_int("seed", request.seed, 0)
        need = len(ids) + request.max_new_tokens + self.B
        if need > self.max_len:
            raise ValueError(f"the request needs {need} positions (prompt {len(ids)} + max_new_tokens "
                             f"{request.max_new_tokens} + block {self.B}); this batcher holds {self.max_len}")
        if request.control is not None and request.control.metric != self.cfg.metric:
            raise ValueError(f"the request's TauControl metric {request.control.metric!r} differs from "
                             f"the batcher's {self.cfg.metric!r}")
        state = RequestState(self._next_id, request, feed=list(ids))
        if self.cfg.temperature > 0:
            state.random = RowRandom(1, request.seed, self.device)
        self._next_id += 1
        self.waiting.append(state)
        return state.request_id

    def cancel(self, request_id: int) -> None:
        """Stop a request: it leaves the batch before the next forward, keeping its tokens."""
        for s in list(self.waiting) + self.live:
            if s.request_id == request_id:
                s.finished = True

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing running."""
        return not self.waiting and not self.live

    def load(self) -> Load:
        """What the tau policy sees before the next forward."""
        secs, tpr = self._last if self._last else (None, None)
        reply = sum(self._replies) / len(self._replies) if self._replies else None
        return Load(len(self.waiting), len(self.live), self.slots, secs, tpr, reply)

    # ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> BatchStep | None:
        """Admit, run one forward, retire. Returns None when nothing is waiting or running."""
        t0 = time.perf_counter()
        ended = self._drop_stopped()
        admitted = self._admit()
        if not self.live:
            return None if not ended else BatchStep(self.steps, float("nan"), 0, 0, 0.0, ended, admitted)
        tau = check_tau(self.policy(self.load()), self.cfg.metric)
        taus = [s.request.control.tau if s.request.control is not None else tau for s in self.live]
        strict = all(_strictest(t, self.cfg.metric) for t in taus)
        P = 1 if strict else self.B  # predictions read per row; masks = P - 1
        logits = cursor_forward(self.model, self.cache, [s.feed for s in self.live],
                                [s.cursor for s in self.live], P, self.mask_id, self.pad_id)  # (R, P, V)
        events = self._accept(logits, taus)
        self.steps += 1
        events += ended
        rows = len(self.live)
        self._retire()
        seconds = time.perf_counter() - t0
        self._last = (seconds, sum(max(len(e.tokens), 1) for e in events[:rows]) / rows)
        return BatchStep(self.steps - 1, tau, len(self.waiting), rows, seconds, events, admitted)

    def run(self) -> Iterator[BatchStep]:
        """Step until every submitted request is done; yields each `BatchStep`."""
        while not self.idle:
            out = self.step()
            if out is not None:
                yield out

    # ---------------------------------------------------------------------------------------
    def _drop_stopped(self) -> list[RequestEvent]:
        """Requests stopped since the last forward leave now (queued ones never start)."""
        for s in self.waiting:
            s.finished = s.finished or (s.request.control is not None and s.request.control.stopped)
        for s in self.live:
            s.finished = s.finished or (s.request.control is not None and s.request.control.stopped)
        gone = [s for s in self.waiting if s.finished] + [s for s in self.live if s.finished]
        self.waiting = deque(s for s in self.waiting if not s.finished)
        self._retire()
        for s in gone:
            self.done[s.request_id] = s
        return [RequestEvent(s.request_id, [], [], float("nan"), True) for s in gone]

    def _admit(self) -> list[int]:
        admitted = []
        while self.waiting and len(self.live) < self.slots:
            s = self.waiting.popleft()  # its cursor is 0: the row's old key/values lie beyond it, never attended
            self.live.append(s)
            admitted.append(s.request_id)
        return admitted

    def _accept(self, logits: torch.Tensor, taus: list[float]) -> list[RequestEvent]:
        """logits (R, P, V) of the live rows, taus one per row: accept, cut, record."""
        live, P = self.live, logits.shape[1]
        noise = None
        if self.cfg.temperature > 0:  # every row draws a full block, as it does decoding alone
            noise = torch.cat([s.random.noise([0], self.B, logits.shape[2]) for s in live])[:, :P]
        tau_t = torch.tensor(taus, dtype=torch.float64, device=logits.device)
        tokens, conf, n_acc = accept(logits, tau_t, self.cfg.metric, self.cfg.temperature, noise, self.cfg.max_accept,
                                     self.cfg.repeat_guard)
        remaining = torch.tensor([s.request.max_new_tokens - len(s.out) for s in live], device=logits.device)
        take, done = cut(tokens, n_acc, self.stop_ids, remaining)
        packed = pack(tokens, conf, take, done).tolist()  # the one host sync
        events = []
        for s, row, t in zip(live, packed, taus):
            o = unpack(row, P)  # the same per-row outcome the decoders read
            s.cursor += len(s.feed)
            s.feed = o.taken
            s.out.extend(o.taken)
            s.conf.extend(o.conf)
            s.taus.append(t)
            s.accepted.append(max(len(o.taken), 1))
            s.finished = o.done
            events.append(RequestEvent(s.request_id, o.taken, o.conf, t, s.finished))
        return events

    def _retire(self) -> None:
        """Free the rows of finished requests, keeping the running ones at the top of the buffer.

        Highest row first: every row above the one being freed is then running, so the last row
        is always a running one to move down."""
        for i in range(len(self.live) - 1, -1, -1):
            if not self.live[i].finished:
                continue
            s, last = self.live[i], len(self.live) - 1
            if i != last:
                self.cache.move_row(last, i, self.live[last].cursor)
                self.live[i] = self.live[last]
            self.live.pop()
            self.done[s.request_id] = s
            self._replies.append(len(s.out))


def _strictest(tau: float, metric: str) -> bool:
    """Does `tau` accept exactly one token per step (see `acceptance.passes`)?"""
    return tau <= 0 if metric == "entropy" else tau >= 1
