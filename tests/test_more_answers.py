"""training.more_answers: new prompts of the generator minus a committed set, distilled by parallel
one-thread processes into disjoint files that together hold every answer, each the base's own greedy
answer; resumable, and 0 only when every share is complete."""
import json

from test_frozen_layers import tiny_model_dir  # noqa: F401 (fixture)
from training import more_answers
from training.chat_prompts import make_prompts
from training.distill import distill, read_prompts


def _run(tmp_path, model_dir, *extra):
    return more_answers.main(["--out", str(tmp_path / "more"), "--model", model_dir, "--n", "9", "--seed", "3",
                              "--exclude", str(tmp_path / "old.jsonl"), "--max-new-tokens", "6",
                              "--batch-size", "2", *extra])


def _records(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def test_two_workers_write_every_new_prompts_answer_once_and_a_rerun_completes_a_cut_file(tmp_path, tiny_model_dir):
    generated = make_prompts(9, 3)
    with open(tmp_path / "old.jsonl", "w") as f:  # two of them already committed
        for i, p in enumerate((generated[1], generated[4])):
            f.write(json.dumps({"id": i, "prompt": p}) + "\n")
    assert _run(tmp_path, tiny_model_dir) == 0
    prompts = read_prompts(tmp_path / "more" / "prompts.jsonl")
    assert [r["prompt"] for r in prompts] == [p for i, p in enumerate(generated) if i not in (1, 4)]
    assert [r["id"] for r in prompts] == list(range(100_000, 100_007))
    parts = [_records(tmp_path / "more" / f"distill-{k}.jsonl") for k in (0, 1)]
    assert [r["id"] for r in parts[0]] == list(range(100_000, 100_004))  # contiguous shares, disjoint
    assert [r["id"] for r in parts[1]] == list(range(100_004, 100_007))

    from mars_core import load_model

    model, tok = load_model(tiny_model_dir)
    distill(model, tok, prompts, str(tmp_path / "alone.jsonl"), 6, 7, log=lambda s: None)
    alone = {r["id"]: r["response_ids"] for r in _records(tmp_path / "alone.jsonl")}
    assert {r["id"]: r["response_ids"] for r in parts[0] + parts[1]} == alone  # the base's greedy answers

    cut = tmp_path / "more" / "distill-1.jsonl"
    cut.write_text("".join(open(cut).readlines()[:1]))  # stopped mid-way
    logs = [(tmp_path / "more" / f"log-{k}.txt").stat().st_size for k in (0, 1)]
    assert _run(tmp_path, tiny_model_dir, "--workers", "3") == 0  # the split is kept: still two shares
    assert sorted(r["id"] for r in _records(cut)) == list(range(100_004, 100_007))
    assert not (tmp_path / "more" / "distill-2.jsonl").exists()
    after = [(tmp_path / "more" / f"log-{k}.txt").stat().st_size for k in (0, 1)]
    assert after[0] == logs[0] and after[1] > logs[1]  # no process (no model load) for the complete share


def test_it_says_so_and_returns_1_while_a_share_is_incomplete(tmp_path, tiny_model_dir, monkeypatch, capsys):
    (tmp_path / "old.jsonl").write_text("")

    class Stopped:  # a worker killed before it wrote anything
        def __init__(self, *a, **k):
            pass

        def wait(self):
            return 0

    monkeypatch.setattr(more_answers.subprocess, "Popen", Stopped)
    assert _run(tmp_path, tiny_model_dir) == 1
    assert "0 of 9 answers" in capsys.readouterr().out


def test_kept_shares_are_read_in_their_numbers_order(tmp_path):
    for k in (0, 1, 2, 10, 9):
        (tmp_path / f"prompts-{k}.jsonl").write_text("")
    got = more_answers.shares(str(tmp_path), [], 3)
    assert [p.rsplit("-", 1)[1] for p in got] == ["0.jsonl", "1.jsonl", "2.jsonl", "9.jsonl", "10.jsonl"]


def test_context_prompts_are_built_from_the_given_answers_with_ids_of_their_own(tmp_path, tiny_model_dir):
    from training.context_prompts import make_context_prompts, read_answers, usable

    with open(tmp_path / "d.jsonl", "w") as f:
        for i in range(60):
            f.write(json.dumps({"id": i, "prompt": f"What is thing {i}?", "ended": True, "response":
                                " ".join(f"Thing {i} is word{i}x{k} in sentence {k} of it." for k in range(4))}) + "\n")
    assert more_answers.main(["--out", str(tmp_path / "ctx"), "--model", tiny_model_dir, "--n", "5", "--seed", "2",
                              "--contexts", str(tmp_path / "d.jsonl"), "--max-new-tokens", "4", "--batch-size", "4"]) == 0
    prompts = read_prompts(tmp_path / "ctx" / "prompts.jsonl")
    want = make_context_prompts(usable(read_answers([str(tmp_path / "d.jsonl")])), 5, 2)
    assert [r["prompt"] for r in prompts] == want and [r["id"] for r in prompts] == list(range(200_000, 200_005))
    got = _records(tmp_path / "ctx" / "distill-0.jsonl") + _records(tmp_path / "ctx" / "distill-1.jsonl")
    assert sorted(r["id"] for r in got) == list(range(200_000, 200_005))


def test_task_prompts_come_from_their_generator_with_ids_of_their_own_and_not_beside_contexts(tmp_path, capsys):
    from training.task_prompts import make_task_prompts

    got = more_answers.write_prompts(str(tmp_path), 7, 4, None, tasks=True)
    assert [r["prompt"] for r in got] == make_task_prompts(7, 4) and [r["id"] for r in got] == list(range(300_000, 300_007))
    assert more_answers.main(["--out", str(tmp_path / "x"), "--tasks", "--contexts", "d.jsonl"]) == 2
    assert "two kinds" in capsys.readouterr().out and not (tmp_path / "x").exists()
