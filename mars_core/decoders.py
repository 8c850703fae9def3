"""Which decoder runs a `DecodeConfig`, and the setup every decode shares.

A `Decoder` is one decoding loop with what it runs (modes, cache, compiled or not) and its role:
a *reference* is slow and obviously correct (no KV cache: every forward recomputes the whole
text), kept as the oracle the fast paths are tested against token for token; a *production*
path is what a user runs. `CORE` holds the decoders a Hub folder's `custom_generate/` carries
(the cursor cache, the exact modes and their references); `generate.DECODERS` adds the sliding,
block and compiled paths.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, TYPE_CHECKING

from .config import DecodeConfig, TauControl
from .decode_cursor import decode_cursor
from .decode_exact import decode_exact
from .decode_shaped import decode_shaped
from .decode_reference import decode_reference
from .decoding import Rows, StepEvent
from .masks import require_sdpa
from .prompts import check_context, special_ids
from .speculative import check_draft_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# (model, rows, mask_id, pad_id, draft_model) -> one StepEvent per forward
Run = Callable[..., Iterator[StepEvent]]


@dataclass(frozen=True)
class Decoder:
    name: str
    role: str  # "reference" or "production"
    modes: tuple[str, ...]
    cache: str
    compiled: bool
    run: Run
    about: str
    when: Callable[[DecodeConfig], bool] | None = None  # a further condition on the config

    def runs(self, config: DecodeConfig) -> bool:
        return (config.mode in self.modes and config.cache == self.cache and bool(config.compile) == self.compiled
                and (self.when is None or self.when(config)))


def plain(fn: Callable[..., Iterator[StepEvent]]) -> Run:
    """A decoder of (model, rows, mask_id, pad_id) as a `Run` (it takes no draft model)."""
    return lambda model, rows, mask_id, pad_id, draft_model=None: fn(model, rows, mask_id, pad_id)


AR_MARS, EXACT = ("ar", "mars"), ("lossless", "spec")


def greedy(config: DecodeConfig) -> bool:
    """Greedy verification: every draft shape runs on the one exact step (`decode_shaped`)."""
    return config.temperature == 0


CORE: tuple[Decoder, ...] = (
    Decoder("reference", "reference", AR_MARS, "none", False, plain(decode_reference),
            "no KV cache, the whole text every forward: the oracle of the cached paths"),
    Decoder("cursor", "production", AR_MARS, "cursor", False, plain(decode_cursor),
            "a write cursor per row: batches decode without waiting for each other"),
    Decoder("shaped-reference", "reference", ("lossless",), "none", False, plain(decode_shaped),
            "greedy lossless, any draft shape, the root and every node as its own causal forward: the oracle of the window",
            greedy),
    Decoder("shaped", "production", ("lossless",), "cursor", False, plain(decode_shaped),
            "greedy lossless: chain, tree, prompt lookup or planned drafts, one exact step per forward", greedy),
    Decoder("shaped-compiled", "production", ("lossless",), "cursor", True, plain(decode_shaped),
            "the same exact step under torch.compile: static shapes in a few window sizes", greedy),
    Decoder("exact-reference", "reference", EXACT, "none", False, decode_exact,
            "lossless / spec with every mask group as its own causal forward: the oracle of the one-forward layout"),
    Decoder("exact", "production", EXACT, "cursor", False, decode_exact,
            "lossless / spec: drafts, verification and mask groups in one forward on the cursor cache"),
)


def pick(table: tuple[Decoder, ...], config: DecodeConfig) -> Decoder:
    """The decoder of `table` that runs `config`, or a ValueError that lists what the table runs."""
    for d in table:
        if d.runs(config):
            return d
    have = "; ".join(f"mode {'/'.join(d.modes)} on cache={d.cache!r}{' compiled' if d.compiled else ''}"
                     for d in table)
    raise ValueError(f"no decoder here runs mode={config.mode!r} on cache={config.cache!r}"
                     f"{' compiled' if config.compile else ''}; available: {have}")


def start(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[list[int]],
          config: DecodeConfig, control: TauControl | None, draft_model: PreTrainedModel | None,
          table: tuple[Decoder, ...]) -> tuple[Rows, Iterator[StepEvent]]:
    """Check everything, then set up a decode of already-tokenised prompts on `table`'s decoder."""
    if not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a DecodeConfig, got {type(config).__name__}")
    if control is None:
        control = TauControl(config.tau, config.metric)
    elif control.metric != config.metric:
        raise ValueError(f"TauControl metric {control.metric!r} differs from config metric {config.metric!r}")
    decoder = pick(table, config)
    check_context(model, prompt_ids, config.max_new_tokens, config.lookahead)
    require_sdpa(model)
    mask_id, pad_id, stop_ids = special_ids(model, tokenizer)
    check_draft_model(model, draft_model, tokenizer, config, mask_id)
    if draft_model is not None:
        require_sdpa(draft_model)
    device = next(model.parameters()).device
    rows = Rows(prompt_ids, config, control, stop_ids, device)
    return rows, decoder.run(model, rows, mask_id, pad_id, draft_model)
