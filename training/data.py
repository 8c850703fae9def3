"""Chat-format instruction data for MARS training: reading, tokenising, batching.

A record is ``{"messages": [{"role": ..., "content": ...}, ...]}`` (other keys are ignored).
Sources (:func:`load_records`): a local JSONL file, the word ``synthetic`` (the seeded tasks of
``tasks.synthetic``) or a Hugging Face dataset name (needs the optional ``datasets``
package and a network).

Bad data fails early with a clear message instead of deep inside torch:

* a line that is not valid JSON, or not a JSON object, or whose ``messages`` is not a list of
  ``{role: str, content: str}`` raises ``ValueError`` naming ``file:line``;
* an empty file raises ``ValueError``;
* a record without ``messages``, without an assistant turn, longer than ``max_length`` tokens
  (unless truncating) or otherwise unusable is *skipped and counted* by reason.

Labels follow the Hugging Face convention (unshifted: the label of a position is its own token
id, ``IGNORE`` where no loss is taken). Only assistant turns carry labels: their content and
the end-of-turn/EOS token that closes them, so the model learns to stop.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset

from mars_core.loss import IGNORE  # the label no loss is taken on: one value for data and loss

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
SYNTHETIC = "synthetic"
ROLES_KEY, CONTENT_KEY = "role", "content"
# Sort lengths inside shuffled groups of this many batches: little padding, still random.
MEGA_BATCHES = 64


class SkipRecord(ValueError):
    """A record that cannot be used; counted under `reason` rather than fatal."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Records:
    """Conversations ready to tokenise, and how many records were skipped, by reason."""

    conversations: tuple = ()
    skipped: dict = field(default_factory=dict)

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())


# --------------------------------------------------------------------------
# Reading records
# --------------------------------------------------------------------------

def check_record(record: object, where: str) -> list[dict]:
    """The validated message list of one record.

    Raises ValueError (naming `where`) for a malformed record, SkipRecord for a well-formed but
    unusable one (no `messages`, no assistant turn).
    """
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "messages" not in record:
        raise SkipRecord("no messages")
    messages = record["messages"]
    if not isinstance(messages, list):
        raise ValueError(f"{where}: 'messages' must be a list, got {type(messages).__name__}")
    for i, message in enumerate(messages):
        ok = (isinstance(message, dict) and isinstance(message.get(ROLES_KEY), str)
              and isinstance(message.get(CONTENT_KEY), str))
        if not ok:
            raise ValueError(f"{where}: messages[{i}] must be an object with string 'role' and 'content', "
                             f"got {message!r:.200}")
    if not any(m[ROLES_KEY] == "assistant" for m in messages):
        raise SkipRecord("no assistant turn")
    # keep only role/content: templates may choke on, or silently render, extra keys
    return [{ROLES_KEY: m[ROLES_KEY], CONTENT_KEY: m[CONTENT_KEY]} for m in messages]


def _collect(records, describe) -> Records:
    """Validate an iterable of raw records; `describe(i)` names record i in error messages."""
    conversations, skipped = [], Counter()
    for i, record in enumerate(records):
        try:
            conversations.append(check_record(record, describe(i)))
        except SkipRecord as skip:
            skipped[skip.reason] += 1
    return Records(tuple(conversations), dict(skipped))


def _parse_lines(path: str):
    """Yield (line number, parsed JSON) for the non-blank lines of `path`."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: malformed JSON: {e.msg} (column {e.colno})") from None


def read_jsonl(path: str) -> Records:
    """Read a chat-format JSONL file. See the module docstring for what fails and what is skipped."""
    if os.path.isdir(path):
        raise ValueError(f"data path {path!r} is a folder; expected a JSONL file")
    if not os.path.isfile(path):
        raise ValueError(f"data file {path!r} does not exist")
    numbered = list(_parse_lines(path))
    if not numbered:
        raise ValueError(f"{path}: the file is empty (no JSON records)")
    return _collect([record for _, record in numbered], lambda i: f"{path}:{numbered[i][0]}")


def _hub_records(name: str, split: str):
    """Rows of a Hugging Face dataset; `datasets` is optional and imported only here."""
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"{name!r} is neither a local file nor {SYNTHETIC!r}; loading it as a Hugging Face dataset "
            "needs the optional package `datasets` (pip install datasets) and network access"
        ) from None
    try:
        return datasets.load_dataset(name, split=split)
    except Exception as e:  # network, unknown name, no such split: one clear message
        raise ValueError(f"could not load Hugging Face dataset {name!r} (split {split!r}; is there a "
                         f"network?): {type(e).__name__}: {e}") from e


def load_records(source: str, *, num_examples: int | None = None, seed: int = 0,
                 split: str = "train") -> Records:
    """Records from a JSONL path, ``synthetic`` or a hub dataset name.

    num_examples: how many synthetic examples to make (default 10000); for the other sources, an
    optional cap (the first `num_examples` usable records). seed: the synthetic data seed.
    """
    if not isinstance(source, str) or not source.strip():
        raise ValueError("the data source must be a JSONL path, 'synthetic' or a dataset name")
    if num_examples is not None and num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples}")
    if source == SYNTHETIC:
        from tasks.synthetic import make_examples

        examples = make_examples(num_examples or 10_000, seed, split)
        return _collect(examples, lambda i: f"synthetic example {i}")
    if os.path.exists(source) or source.endswith((".jsonl", ".json")):
        records = read_jsonl(source)
    else:
        rows = _hub_records(source, split)
        records = _collect(rows, lambda i: f"{source}[{split}] row {i}")
    if num_examples is not None:
        records = Records(records.conversations[:num_examples], records.skipped)
    return records


# --------------------------------------------------------------------------
# Tokenising with assistant-only labels
# --------------------------------------------------------------------------

def _render(tokenizer, messages: list[dict], generation_prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=generation_prompt)
    except Exception as e:  # e.g. a role the template refuses: a property of this record
        raise SkipRecord(f"chat template error: {type(e).__name__}") from e


def assistant_spans(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans that carry labels.

    The conversation is rendered prefix by prefix (chat templates are prefix-stable): an
    assistant turn's labelled span starts where the render of the messages before it plus the
    generation prompt ends, and runs through the first end-of-turn (EOS) string after that, or to
    the end of the turn (less trailing whitespace) when the template writes no EOS.
    """
    if messages[0][ROLES_KEY] == "assistant":
        # the prefix before it would be an empty conversation, which templates refuse to render
        raise SkipRecord("conversation starts with an assistant turn")
    full = _render(tokenizer, messages)
    eos = tokenizer.eos_token
    spans = []
    for i, message in enumerate(messages):
        if message[ROLES_KEY] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], generation_prompt=True)
        upto = _render(tokenizer, messages[: i + 1])
        if not (upto.startswith(before) and full.startswith(upto)):
            raise ValueError("the tokenizer's chat template is not prefix-stable (rendering the first "
                             f"{i + 1} messages is not a prefix of the whole conversation); "
                             "assistant labels cannot be placed")
        start = len(before)
        stop = upto.find(eos, start) if eos else -1
        end = stop + len(eos) if stop >= 0 else len(upto.rstrip())
        spans.append((start, end))
    return full, spans


@dataclass(frozen=True)
class Tokenized:
    """One training example: token ids and unshifted labels of the same length."""

    input_ids: tuple
    labels: tuple

    def __post_init__(self):
        if len(self.input_ids) != len(self.labels):
            raise ValueError(f"input_ids ({len(self.input_ids)}) and labels ({len(self.labels)}) differ in length")


def tokenize_record(tokenizer: PreTrainedTokenizerBase, messages: list[dict], max_length: int, truncate: bool = False) -> Tokenized:
    """Token ids and labels (assistant content + closing EOS; IGNORE elsewhere).

    The whole conversation is tokenised in one go, exactly as `apply_chat_template(tokenize=True)`
    does, and a token is labelled when its character offsets overlap an assistant span. Longer
    than `max_length`: SkipRecord("longer than max_length"), or, with `truncate`, the first
    `max_length` tokens (SkipRecord when no labelled token is left). Needs a fast tokenizer.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("tokenize_record needs a fast (Rust) tokenizer for character offsets")
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = [
        tid if any(s < end and e > start for start, end in spans) and e > s else IGNORE
        for tid, (s, e) in zip(ids, enc["offset_mapping"])
    ]
    if len(ids) > max_length:
        if not truncate:
            raise SkipRecord("longer than max_length")
        ids, labels = ids[:max_length], labels[:max_length]
    if all(label == IGNORE for label in labels):
        raise SkipRecord("no response tokens within max_length")
    return Tokenized(tuple(ids), tuple(labels))


class TokenizedDataset(Dataset):
    """Tokenised examples in memory; item i is a `Tokenized`."""

    def __init__(self, examples: list[Tokenized]):
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Tokenized:
        return self.examples[i]

    @property
    def lengths(self) -> list[int]:
        return [len(x.input_ids) for x in self.examples]


def build_dataset(tokenizer: PreTrainedTokenizerBase, conversations: list[list[dict]], max_length: int,
                  truncate: bool = False) -> tuple[TokenizedDataset, dict]:
    """Tokenise every conversation; returns the dataset and the skip counts by reason."""
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    examples, skipped = [], Counter()
    for messages in conversations:
        try:
            examples.append(tokenize_record(tokenizer, messages, max_length, truncate))
        except SkipRecord as skip:
            skipped[skip.reason] += 1
    return TokenizedDataset(examples), dict(skipped)


# --------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Collator:
    """Right-pad a list of `Tokenized` into tensors: input_ids / labels / attention_mask (B, T)."""

    pad_id: int

    def __call__(self, batch: list[Tokenized]) -> dict:
        width = max(len(x.input_ids) for x in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)  # (B, T)
        labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)  # (B, T)
        mask = torch.zeros((len(batch), width), dtype=torch.long)  # (B, T)
        for row, x in enumerate(batch):
            n = len(x.input_ids)
            ids[row, :n] = torch.tensor(x.input_ids)
            labels[row, :n] = torch.tensor(x.labels)
            mask[row, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


class LengthGroupedBatchSampler:
    """Batches of similar length, in an order fixed by (seed, epoch).

    Each epoch: shuffle all indices, cut them into groups of `mega_batches * batch_size`, sort
    each group by length and cut it into batches, then shuffle the batch order. The incomplete
    last batch is dropped so every batch (and every rank's share of it) has `batch_size`
    examples. Call `set_epoch` before iterating.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int, mega_batches: int = MEGA_BATCHES):
        if batch_size < 1 or mega_batches < 1:
            raise ValueError(f"batch_size and mega_batches must be >= 1, got {batch_size}, {mega_batches}")
        if len(lengths) < batch_size:
            raise ValueError(f"{len(lengths)} usable examples cannot fill one batch of {batch_size}")
        self.lengths = list(lengths)
        self.batch_size = batch_size  # read by accelerate's BatchSamplerShard
        self.drop_last = True
        self.seed = seed
        self.mega_batches = mega_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths) // self.batch_size

    def batches(self, epoch: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        group = self.mega_batches * self.batch_size
        batches = []
        for g in range(0, len(order), group):
            chunk = sorted(order[g: g + group], key=lambda i: self.lengths[i], reverse=True)
            batches.extend(chunk[b: b + self.batch_size] for b in range(0, len(chunk), self.batch_size))
        batches = [b for b in batches if len(b) == self.batch_size]  # only the very last can be short
        shuffle = torch.randperm(len(batches), generator=generator).tolist()
        return [batches[i] for i in shuffle]

    def __iter__(self):
        return iter(self.batches(self.epoch))
