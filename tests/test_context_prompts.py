"""training.context_prompts: prompts over the base's own answers, built by rule and never from a
held-out answer."""
import json

import pytest

from training import context_prompts as cp


def records(n=200):
    out = []
    for i in range(n):
        words = " ".join(f"w{i}x{k}" for k in range(30))  # every answer's words are its own
        prompt = f"What is subject {i}?" if i % 3 == 0 else f"Write a paragraph about subject {i}."
        out.append({"id": i, "prompt": prompt, "ended": True,
                    "response": f"Subject {i} is a thing worth a long sentence here. {words}. It ends here now."})
    return out


def test_the_same_answers_and_seed_give_the_same_prompts_and_a_seed_others():
    passages = cp.usable(records())
    a, b, c = (cp.make_context_prompts(passages, 150, s) for s in (0, 0, 1))
    assert a == b and a != c and len(set(a)) == 150


def test_no_held_out_answer_is_ever_a_context():
    got = "\n".join(cp.make_context_prompts(cp.usable(records()), 300, 0))
    for i in range(0, 200, 20):  # every 20th id is held out by the gated stage
        assert f"w{i}x" not in got, i
    assert "w1x0" in got or "w3x0" in got  # and trained-on answers are


def test_a_question_over_passages_holds_its_own_answer_within_the_word_budget():
    recs = records()
    passages = cp.usable(recs)
    asked = 0
    for p in cp.make_context_prompts(passages, 300, 0):
        if "Passage 1:" not in p:
            continue
        asked += 1
        q = next(r for r in recs if r["prompt"] in p or r["prompt"][0].lower() + r["prompt"][1:] in p)
        assert q["response"] in p and q["id"] % 20 and q["prompt"].endswith("?")
        n_docs = p.count("Passage ")
        assert 1 <= n_docs <= 4 and sum(len(d.split()) for d in p.split("Passage ")[1:]) <= cp.CONTEXT_WORDS + 2 * n_docs + 20
    assert asked > 30


def test_a_capped_answer_ends_at_its_last_full_sentence_and_a_repeated_line_is_no_context():
    capped = {"id": 1, "prompt": "p", "ended": False,
              "response": " ".join(f"Sentence {k} has words{k} enough{k} to count{k} here." for k in range(4)) + " And a cut-off sent"}
    looping = {"id": 2, "prompt": "p", "ended": True, "response": "The same few words. " * 20}
    got = cp.usable([capped, looping])
    assert len(got) == 1 and got[0]["response"].endswith("count3 here.") and "cut-off" not in got[0]["response"]


def test_sentences_to_translate_are_plain_prose():
    got = cp.sentences("1. **Bold item** here is one.\nA plain sentence of quite enough words. `code` is here too now! Short one.")
    assert got == ["A plain sentence of quite enough words."]


def test_too_few_answers_and_a_bad_line_get_a_message(tmp_path, capsys):
    with pytest.raises(ValueError, match="too few"):
        cp.make_context_prompts(cp.usable(records(3)), 5, 0)
    (tmp_path / "d.jsonl").write_text('{"id": 1, "prompt": "p"}\n')
    assert cp.main(["--answers", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "d.jsonl:1: not a distill record" in capsys.readouterr().out


def test_the_command_writes_ids_from_its_first_id(tmp_path):
    with open(tmp_path / "d.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records())
    assert cp.main(["--answers", str(tmp_path / "d.jsonl"), "--n", "20", "--first-id", "500",
                    "--out", str(tmp_path / "o.jsonl")]) == 0
    rows = [json.loads(line) for line in open(tmp_path / "o.jsonl")]
    assert [r["id"] for r in rows] == list(range(500, 520))


def test_the_committed_prompts_are_still_the_generators_seed_0():
    """The module's docstring promises the committed set can be regenerated bit for bit."""
    import os

    from training.chat_prompts import make_prompts

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "smollm2", "prompts.jsonl")
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert [r["prompt"] for r in rows] == make_prompts(len(rows), 0) and [r["id"] for r in rows] == list(range(len(rows)))
