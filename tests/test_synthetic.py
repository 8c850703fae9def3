"""Tests for the seeded synthetic task generator (tasks.synthetic)."""

import json
import re

import pytest

from tasks import synthetic
from tasks.synthetic import extract_answer, make_examples, score



@pytest.fixture(scope="module")
def train():
    return make_examples(3000, seed=0, split="train")


@pytest.fixture(scope="module")
def eval_set():
    return make_examples(1000, seed=0, split="eval")


def question(example):
    return example["messages"][0]["content"]


def solution(example):
    return example["messages"][1]["content"]


def test_example_shape(train):
    for ex in train[:50]:
        assert set(ex) == {"messages", "answer", "family"}
        assert [m["role"] for m in ex["messages"]] == ["user", "assistant"]
        assert isinstance(ex["answer"], str) and ex["answer"]
        assert solution(ex).splitlines()[-1] == f"#### {ex['answer']}"


def test_deterministic_per_seed_and_split():
    assert make_examples(200, seed=7) == make_examples(200, seed=7)
    assert make_examples(200, seed=7) != make_examples(200, seed=8)
    assert make_examples(50, seed=7, split="eval") == make_examples(50, seed=7, split="eval")


def test_train_and_eval_are_disjoint(train, eval_set):
    train_questions = {question(ex) for ex in train}
    eval_questions = {question(ex) for ex in eval_set}
    assert not train_questions & eval_questions
    # Different seeds of the same split still never cross over.
    other_eval = {question(ex) for ex in make_examples(1000, seed=1, split="eval")}
    assert not train_questions & other_eval


def test_split_is_decided_by_a_stable_hash():
    assert synthetic.split_of("arithmetic:45 +23") == synthetic.split_of("arithmetic:45 +23")
    splits = [synthetic.split_of(f"key{i}") for i in range(2000)]
    assert 0.05 < splits.count("eval") / len(splits) < 0.15


def test_no_duplicates_within_a_call(train, eval_set):
    for examples in (train, eval_set):
        questions = [question(ex) for ex in examples]
        assert len(set(questions)) == len(questions)


def test_family_proportions(train):
    counts = {f: sum(ex["family"] == f for ex in train) for f in ("arithmetic", "units", "lists")}
    assert counts == {"arithmetic": 1800, "units": 600, "lists": 600}
    assert sum(counts.values()) == len(train)


STEP = re.compile(r"so (\d+) ([-+*/]) (\d+)\b(.*)\.$")


def check_chain(equation: str) -> int:
    """Every side of `a = b = c` evaluates to the same integer; returns it."""
    values = set()
    for side in equation.split(" = "):
        assert re.fullmatch(r"[\d +*/-]+", side), side
        value = eval(side.replace("/", "//"))  # noqa: S307 - digits and operators only
        if "/" in side:
            a, b = (int(t) for t in side.split(" / "))
            assert a % b == 0
        values.add(value)
    assert len(values) == 1, equation
    return values.pop()


def test_arithmetic_solutions_are_exact_and_in_range(train):
    arithmetic = [ex for ex in train if ex["family"] == "arithmetic"]
    step_counts = set()
    for ex in arithmetic:
        lines = solution(ex).splitlines()[:-1]
        step_counts.add(len(lines))
        previous = None
        for line in lines:
            a, op, b, _ = STEP.search(line).groups()
            a, b = int(a), int(b)
            assert a >= 10 and b >= 10, line
            work = line[line.index("so ") + 3: -1]
            for part in re.split(r": |, (?:so )?", work):  # division shows several equations
                result = check_chain(part)
            expected = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
            assert result == expected and 10 <= result < 10_000, line
            if op == "/":
                assert a % b == 0 and result < 100
            if previous is not None:  # each step continues from the last
                assert a == previous
            previous = result
        assert str(previous) == ex["answer"]
    assert step_counts == {1, 2, 3}


def test_score_accepts_gold_and_rejects_corruptions(train):
    assert all(score(solution(ex), ex["answer"]) for ex in train)
    for ex in train:
        lines = solution(ex).splitlines()
        wrong = "[1, 2]" if ex["answer"].startswith("[") else str(int(ex["answer"]) + 1)
        changed = "\n".join(lines[:-1] + [f"#### {wrong}"])
        dropped = "\n".join(lines[:-1])
        assert not score(changed, ex["answer"])
        assert not score(dropped, ex["answer"])


def test_score_normalisation():
    assert score("so 45 + 23 = 68.\n####   68  ", "68")
    assert score("#### 68.0", "68")
    assert score("#### 1,000", "1000")
    assert score("#### [12,45, 67]", "[12, 45, 67]")
    assert not score("#### [12, 67, 45]", "[12, 45, 67]")
    assert not score("The answer is 68.", "68")
    assert not score("####", "68")
    assert extract_answer("steps\n#### 7\n#### 8") == "7"
    assert extract_answer("no answer here") is None


def test_texts_are_short(train):
    lengths = [len(question(ex)) + len(solution(ex)) for ex in train]
    assert max(lengths) < 600


@pytest.mark.parametrize(
    "kwargs",
    [dict(n=-1, seed=0), dict(n=5, seed=0, split="test"), dict(n=5, seed="0")],
)
def test_bad_input_raises(kwargs):
    with pytest.raises(ValueError):
        make_examples(**kwargs)


def test_cli_writes_jsonl(tmp_path, capsys):
    out = tmp_path / "data.jsonl"
    assert synthetic.main(["--n", "20", "--seed", "3", "--split", "eval", "--output", str(out), "--show", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == make_examples(20, seed=3, split="eval")
    assert "#### " in capsys.readouterr().out
