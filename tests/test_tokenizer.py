"""Tests for the byte-level BPE chat tokenizer (training.tokenizer)."""

import pytest
from transformers import AutoTokenizer

from training import tokenizer as tok
from tasks.synthetic import make_examples

VOCAB = 512


@pytest.fixture(scope="module")
def examples():
    return make_examples(3000, seed=0, split="train")


@pytest.fixture(scope="module")
def saved(examples, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer = tok.build_tokenizer(tok.corpus_from_examples(examples), VOCAB, str(folder))
    return tokenizer, folder


def test_vocab_and_special_tokens(saved):
    tokenizer, _ = saved
    assert len(tokenizer) == VOCAB
    assert tokenizer.eos_token == "<|end|>"
    assert tokenizer.pad_token == "<|pad|>"
    assert tokenizer.mask_token == "<|mask|>"
    for token in tok.SPECIAL_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids[0]) == token
    assert isinstance(tokenizer.mask_token_id, int)
    assert len({tokenizer.convert_tokens_to_ids(t) for t in tok.SPECIAL_TOKENS}) == len(tok.SPECIAL_TOKENS)


def test_every_digit_is_its_own_token(saved):
    tokenizer, _ = saved
    tokens = tokenizer.tokenize("so 1234 + 56 = 1290 and 007")
    digit_tokens = [t for t in tokens if any(c.isdigit() for c in t)]
    assert digit_tokens == list("1234561290007")


@pytest.mark.parametrize(
    "text",
    ["Tom had 45 apples and bought 23 more, so 45 + 23 = 68.\n#### 68",
     "  spaces\tand\ttabs\n\nnewlines  ", "café ü 🙂 [12, 45, 67]", ""],
)
def test_round_trip(saved, text):
    tokenizer, _ = saved
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_renders(saved):
    tokenizer, _ = saved
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2 + 3 = 5.\n#### 5"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == (
        "<|system|>\nBe brief.<|end|>\n"
        "<|user|>\nWhat is 2 + 3?<|end|>\n"
        "<|assistant|>\n2 + 3 = 5.\n#### 5<|end|>\n"
    )
    prompt = tokenizer.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|user|>\nWhat is 2 + 3?<|end|>\n<|assistant|>\n"
    ids = tok.chat_ids(tokenizer, messages)
    assert tokenizer.decode(ids) == rendered
    assert ids.count(tokenizer.eos_token_id) == 3


def test_unknown_role_is_rejected(saved):
    tokenizer, _ = saved
    with pytest.raises(Exception, match="unknown chat role"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_saved_folder_reloads(saved):
    tokenizer, folder = saved
    reloaded = AutoTokenizer.from_pretrained(str(folder))
    text = "Anna had 120, split into 12 equal parts, so 120 / 12 = 10."
    assert reloaded.encode(text) == tokenizer.encode(text)
    assert reloaded.eos_token == "<|end|>" and reloaded.mask_token == "<|mask|>"
    assert reloaded.pad_token_id == tokenizer.pad_token_id
    messages = [{"role": "user", "content": "hi"}]
    assert reloaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_examples_are_short(saved):
    tokenizer, _ = saved
    lengths = sorted(len(tok.chat_ids(tokenizer, ex["messages"])) for ex in make_examples(500, 1, "eval"))
    assert lengths[len(lengths) // 2] < 200  # a typical example
    assert lengths[int(0.95 * len(lengths))] < 260  # shown multiplication/division work


def test_bad_input_raises():
    with pytest.raises(ValueError):
        tok.build_tokenizer(["abc"], vocab_size=100)
    with pytest.raises(ValueError):
        tok.build_tokenizer([], vocab_size=512)
    with pytest.raises(ValueError):
        tok.corpus_from_examples([{"text": "no messages"}])
