"""benchmarks.real_eval: the summary figures from hand-written records, and a resumable run."""
import json

import pytest

from benchmarks.real_card import legend
from benchmarks.real_eval import (first_difference, gsm8k_answer, is_correct, main, ordered, read_set, settings,
                                    summarise, table, tau_of)


def _write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one stopped early
    assert first_difference([], [4]) == 0


def test_is_correct_matches_numbers_alone_and_words_in_any_case():
    assert is_correct("The answer is 42.", ["42"])
    assert not is_correct("It is 142 or 420.", ["42"])
    assert not is_correct("10 degrees", ["0"]) and is_correct("0°C", ["0"])
    assert is_correct("the capital is paris", ["Paris"])


def test_gsm8k_answers_score_the_last_number():
    ref = ["He pays 400*.5=$<<400*.5=200>>200 more\nSo it cost 600+400=$<<600+400=1000>>1000 in total.\n#### 1,000"]
    assert gsm8k_answer(ref) == {"answers": ["1000"], "rule": "last-number"}
    assert gsm8k_answer(["An essay with no final line."]) == {} and gsm8k_answer(None) == {}
    rule = "last-number"
    assert is_correct("200 more, so 1,000 in total.", ["1000"], rule)
    assert not is_correct("It costs 1000, not counting the 200 extra.", ["1000"], rule)  # contains, but not last
    assert is_correct("The answer is 12.5.", ["12.5"], rule) and is_correct("-3", ["-3"], rule)
    assert not is_correct("no number here", ["3"], rule)


def test_summary_per_category_against_ar(tmp_path):
    rec = lambda s, i, c, ids, f, **k: {"setting": s, "id": i, "category": c, "tokens": len(ids), "forwards": f,
                                        "ids": ids, **k}
    _write(tmp_path / "o.jsonl", [
        rec("ar", 1, "qa", [1, 2, 3, 4], 5, correct=True), rec("ar", 2, "math", [5, 6], 3, correct=False),
        rec("mars-0.9", 1, "qa", [1, 2, 3, 4], 2, correct=True), rec("mars-0.9", 2, "math", [5, 7], 1, correct=True),
    ])
    s = summarise(str(tmp_path / "o.jsonl"))
    assert list(s) == ["ar", "mars-0.9"]
    assert s["ar"]["overall"] == {"n": 2, "tokens_per_forward": 0.75, "identical": 1.0, "first_difference": None,
                                  "accuracy": 0.5}
    assert s["mars-0.9"]["qa"]["tokens_per_forward"] == 2.0
    assert s["mars-0.9"]["overall"]["tokens_per_forward"] == 2.0  # 6 tokens / 3 forwards
    assert s["mars-0.9"]["overall"]["identical"] == 0.5 and s["mars-0.9"]["overall"]["first_difference"] == 1
    assert s["mars-0.9"]["overall"]["accuracy"] == 1.0
    assert "| math | 0.67 | 2.00 (0%) |" in table(s)


def test_the_summary_covers_the_prompts_asked_for(tmp_path):
    rec = lambda s, i, f: {"setting": s, "id": i, "category": "qa", "tokens": 4, "forwards": f, "ids": [1, 2, 3, 4]}
    _write(tmp_path / "o.jsonl", [rec("ar", 1, 4), rec("ar", 2, 4), rec("lossless", 1, 2), rec("ar", 3, 4)])
    s = summarise(str(tmp_path / "o.jsonl"), only={1, 2})
    assert s["ar"]["overall"]["n"] == 2 and s["lossless"]["overall"]["n"] == 1
    assert summarise(str(tmp_path / "o.jsonl"))["ar"]["overall"]["n"] == 3


def test_the_table_orders_settings_by_tau_whatever_order_they_ran_in():
    cell = {"overall": {"n": 1, "tokens_per_forward": 1.0, "identical": 1.0, "first_difference": None}}
    ran = ["mars-0.95", "ar", "lossless", "mars-0.8", "mars-1"]  # a sweep run in two stages
    header = table({s: cell for s in ran}).splitlines()[0]
    assert header == "| category | ar | mars-1 | mars-0.95 | mars-0.8 | lossless |"


def test_a_setting_decoded_on_fewer_prompts_says_so_in_its_heading():
    cell = lambda n: {"overall": {"n": n, "tokens_per_forward": 1.0, "identical": 1.0, "first_difference": None}}
    header = table({"ar": cell(480), "mars-0.9": cell(130), "mars-0.9-guard": cell(480)}).splitlines()[0]
    assert header == "| category | ar | mars-0.9 (130 prompts) | mars-0.9-guard |"


def test_the_repeat_guard_runs_beside_each_tau_and_keeps_its_tau():
    named = settings([0.95, 0.9], False, 4, ar=True, repeat_guard=True)
    assert list(named) == ["ar", "mars-0.95", "mars-0.95-guard", "mars-0.9", "mars-0.9-guard"]
    assert named["mars-0.9-guard"].repeat_guard and not named["mars-0.9"].repeat_guard
    assert named["mars-0.9-guard"].tau == 0.9 and tau_of("mars-0.9-guard") == 0.9
    assert ordered({s: {} for s in ["mars-0.9-guard", "lossless", "mars-0.9", "ar", "mars-0.95-guard"]}) == [
        "ar", "mars-0.95-guard", "mars-0.9", "mars-0.9-guard", "lossless"]
    assert "repeat guard" in legend({"mars-0.9-guard": {}})[0] and legend({"mars-0.9": {}}) == []
    only = settings([0.9], False, 4, ar=False, guard_only=True)
    assert list(only) == ["mars-0.9-guard"] and only["mars-0.9-guard"].repeat_guard


def test_per_category_keeps_the_first_n_of_each_category_in_file_order(tmp_path):
    cats = ["a", "a", "a", "b", "a", "b", "b", "c"]
    _write(tmp_path / "sb.jsonl", [{"question_id": i, "category": c, "turns": [f"Q{i}"]} for i, c in enumerate(cats)])
    got = read_set("spec-bench", str(tmp_path / "sb.jsonl"), per_category=2)
    assert [r["id"] for r in got] == [0, 1, 3, 5, 7]


def test_read_set_formats_and_a_bad_line(tmp_path):
    _write(tmp_path / "sb.jsonl", [{"question_id": 3, "category": "qa", "turns": ["Q1", "Q2"]}])
    assert read_set("spec-bench", str(tmp_path / "sb.jsonl")) == [{"id": 3, "category": "qa", "prompt": "Q1"}]
    _write(tmp_path / "si.jsonl", [{"id": "t0", "instruction": "Fix it.", "instances": [{"input": "teh", "output": "the"}]}])
    assert read_set("self-instruct", str(tmp_path / "si.jsonl"))[0]["prompt"] == "Fix it.\n\nteh"
    _write(tmp_path / "bad.jsonl", [{"nope": 1}])
    with pytest.raises(ValueError, match="bad.jsonl:1: not a spec-bench record"):
        read_set("spec-bench", str(tmp_path / "bad.jsonl"))


def test_a_run_resumes_and_tau_one_is_identical_to_ar(tmp_path, capsys):
    tiny_mars_dir = "assets/models/tiny-mars-b4"
    _write(tmp_path / "p.jsonl", [{"id": i, "prompt": p} for i, p in enumerate(["Tom has 12 apples.", "Hi", "What is 24 * 3?"])])
    args = ["--model", tiny_mars_dir, "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "r"),
            "--taus", "1,0.5", "--max-new-tokens", "12", "--batch-size", "2"]
    assert main(args) == 0
    lines = (tmp_path / "r" / "outputs.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 4  # ar, tau 1, tau 0.5, lossless
    assert main(args) == 0
    assert len((tmp_path / "r" / "outputs.jsonl").read_text().splitlines()) == 12  # nothing decoded twice
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["mars-1"]["overall"]["identical"] == 1.0 and s["lossless"]["overall"]["identical"] == 1.0


def test_a_missing_prompt_file_is_one_line(tmp_path, capsys):
    assert main(["--prompts", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().out.startswith("error: ")


def test_a_setting_is_named_by_what_changes_its_tokens_per_forward():
    """The lookup length and a group layout other than "all" change tokens per forward (2.01 vs
    2.12 on self-instruct): two such runs must not share a column name."""
    plain = settings([], True, 4, ar=False)
    assert list(plain) == ["lossless"] and legend({s: {} for s in plain}) == []
    named = settings([], True, 4, ar=False, draft_groups="last", prompt_lookup=2, prompt_lookup_tokens=10)
    assert list(named) == ["lossless-last", "lossless-lookup2-L10-last"]
    assert named["lossless-lookup2-L10-last"].prompt_lookup_tokens == 10
    assert named["lossless-last"].draft_groups == "last" and named["lossless-last"].prompt_lookup == 0
    assert list(settings([], False, 4, ar=False, prompt_lookup=3)) == ["lossless-lookup3"]
    assert "-LM: up to M lookup drafts" in legend({s: {} for s in named})[0]
