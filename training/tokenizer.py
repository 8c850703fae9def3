"""A small byte-level BPE tokenizer with a chat template, for the synthetic tasks.

Digits are split off one by one before BPE, so every digit is its own token
and numbers are never merged into opaque chunks (tiny models learn
arithmetic far better that way). Byte-level BPE makes every string
encodable and decoding round-trips the text exactly.

Special tokens: ``<|pad|>`` (padding), ``<|system|>``, ``<|user|>``,
``<|assistant|>`` (turn headers), ``<|end|>`` (end of turn, the EOS token)
and ``<|mask|>`` (the mask token). Each message renders as::

    <|role|>\\n{content}<|end|>\\n

and ``add_generation_prompt`` appends ``<|assistant|>\\n``.

CLI: ``python -m training.tokenizer --vocab-size 512 --n 20000 --seed 0
--output DIR`` trains on synthetic train examples and saves a standard
Hugging Face tokenizer folder. Load it with ``mars_core.loading.load_tokenizer``
(or ``load_model``): ``AutoTokenizer`` may swap in a model-specific class that
re-tokenizes differently (see ``load_tokenizer``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, SYSTEM, USER, ASSISTANT, END, MASK = (
    "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|mask|>",
)
# Order fixes the ids: <|pad|> is 0, then the rest in this order.
SPECIAL_TOKENS = (PAD, SYSTEM, USER, ASSISTANT, END, MASK)

# Jinja string literals turn '\n' into a newline; unknown roles fail loudly.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
# The smallest vocabulary that holds the 256 byte symbols plus the specials.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


def corpus_from_examples(examples: Iterable[dict]) -> list[str]:
    """One training text per example: its messages as plain turn texts.

    Special tokens are left out on purpose; they are added to the vocabulary
    whole, so BPE merges should be spent on the task's own text.
    """
    texts = []
    for example in examples:
        try:
            texts.extend(message["content"] for message in example["messages"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"example has no messages list of {{role, content}}: {example!r}") from exc
    return texts


def _backend(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train the raw ``tokenizers`` byte-level BPE model."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # Seed all 256 byte symbols so any text is encodable, seen or not.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def build_tokenizer(
    texts: Iterable[str], vocab_size: int, output_dir: str | None = None
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it for transformers.

    The result has eos ``<|end|>``, pad ``<|pad|>``, mask ``<|mask|>`` and the
    chat template above; it is saved with ``save_pretrained`` when
    ``output_dir`` is given.
    """
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be an int >= {MIN_VOCAB_SIZE}, got {vocab_size!r}")
    texts = list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a non-empty iterable of strings")

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_backend(texts, vocab_size),
        eos_token=END,
        pad_token=PAD,
        mask_token=MASK,
        extra_special_tokens=[SYSTEM, USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE,
    )
    if output_dir is not None:
        tokenizer.save_pretrained(output_dir)
    return tokenizer


def chat_ids(tokenizer: PreTrainedTokenizerFast, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` rendered with the chat template.

    transformers 5 returns a BatchEncoding from ``apply_chat_template`` by
    default; this asks for the plain id list instead.
    """
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m training.tokenizer``."""
    from tasks.synthetic import make_examples  # keeps the import graph one-way

    parser = argparse.ArgumentParser(
        prog="python -m training.tokenizer",
        description="Train a byte-level BPE chat tokenizer (single-digit tokens) "
        "on synthetic train examples and save it as a Hugging Face tokenizer folder.",
    )
    parser.add_argument("--vocab-size", type=int, default=512, help="vocabulary size (default 512)")
    parser.add_argument("--n", type=int, default=20000, help="synthetic train examples to train on")
    parser.add_argument("--seed", type=int, default=0, help="seed for the synthetic examples")
    parser.add_argument("--output", required=True, help="folder to save the tokenizer into")
    args = parser.parse_args(argv)
    if args.n <= 0:
        parser.error("--n must be positive")

    examples = make_examples(args.n, args.seed, "train")
    tokenizer = build_tokenizer(corpus_from_examples(examples), args.vocab_size, args.output)
    lengths = sorted(len(chat_ids(tokenizer, ex["messages"])) for ex in examples)
    print(
        f"saved tokenizer with {len(tokenizer)} tokens to {args.output}; "
        f"chat example length median {lengths[len(lengths) // 2]}, max {lengths[-1]} tokens"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
