"""The real model's card is written from measured summaries: the base's own math accuracy sits
beside the fine-tune's, and the frontier's base point pools the same prompt sets as the rest."""
import json

from benchmarks import real_card


def _summary(folder, summary):
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(summary))
    return str(folder)


def _cell(n, acc, tpf=1.0, identical=None):
    return {"n": n, "accuracy": acc, "tokens_per_forward": tpf, "identical": identical, "first_difference": None}


def test_the_card_puts_the_base_beside_the_fine_tune_on_math(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "args.json").write_text(json.dumps({"accum": 8, "threads": 2, "train_layers": 6}))
    (run / "log.jsonl").write_text(json.dumps({"step": 3, "minutes": 1.0, "noisy": 2.0, "clean": 0.2}) + "\n")
    intro = tmp_path / "intro.md"
    intro.write_text("# card")
    known = _summary(tmp_path / "known", {"ar": {"known-answers": _cell(40, 0.7)},
                                          "mars-0.95": {"known-answers": _cell(40, 0.6, 1.1, 0.7)}})
    known_base = _summary(tmp_path / "known-base", {"ar": {"known-answers": _cell(40, 0.5)}})
    sb = _summary(tmp_path / "sb", {"ar": {"math_reasoning": _cell(80, 0.3), "overall": _cell(80, 0.3)},
                                    "mars-0.95": {"math_reasoning": _cell(80, 0.2, 1.2, 0.5),
                                                  "overall": _cell(80, 0.2, 1.2, 0.5)}})
    sb_base = _summary(tmp_path / "sb-base", {"ar": {"math_reasoning": _cell(80, 0.1)}})
    out = tmp_path / "card"
    assert real_card.main(["--run", str(run), "--intro", str(intro), "--out", str(out), "--known", known,
                           "--known-base", known_base, "--spec-bench", sb, "--spec-bench-base", sb_base]) == 0
    card = (out / "README.md").read_text()
    math = card[card.index("math_reasoning` of Spec-Bench"):]
    assert "| base | AR | 80 | 10.0% |" in math and "| MARS fine-tune | mars-0.95 | 80 | 20.0% |" in math
    runs = {r["model"] + "/" + str(r["tau"]): r for r in json.loads((out / "eval.json").read_text())["runs"]}
    base = runs["smollm2-135m-instruct/1.0"]
    assert base["n"] == 120 and abs(base["accuracy"] - (0.5 * 40 + 0.1 * 80) / 120) < 1e-4
    assert runs["card/0.95"]["n"] == 120


def test_without_the_bases_math_the_frontier_leaves_math_out_of_every_point():
    known = {"ar": {"known-answers": _cell(40, 0.7)}}
    sb = {"ar": {"math_reasoning": _cell(80, 0.3)}}
    result = real_card.frontier(known, {"ar": {"known-answers": _cell(40, 0.5)}}, sb, "m")
    assert result["split"] == "known-answers" and all(r["n"] == 40 for r in result["runs"])


def test_a_setting_decoded_on_one_set_only_is_no_point_of_the_pooled_frontier():
    """Lossless with a draft tree ran on the known answers but not on math_reasoning: its point
    would be an accuracy of 40 questions beside points of 120."""
    known = {"ar": {"known-answers": _cell(40, 0.7)}, "lossless": {"known-answers": _cell(40, 0.7, 1.4)},
             "lossless-tree2-2-1": {"known-answers": _cell(40, 0.7, 1.6)}}
    sb = {"ar": {"math_reasoning": _cell(80, 0.3)}, "lossless": {"math_reasoning": _cell(80, 0.3, 1.5)}}
    result = real_card.frontier(known, {"ar": {"known-answers": _cell(40, 0.5)}}, sb, "m",
                                {"ar": {"math_reasoning": _cell(80, 0.1)}})
    assert [r["model"] for r in result["runs"]] == ["smollm2-135m-instruct", "m", "m (lossless)"]
    assert all(r["n"] == 120 for r in result["runs"])


def test_the_card_says_which_spec_bench_prompts_were_decoded():
    per_cat = lambda n, cats: {"ar": {**{c: _cell(n, 0.0) for c in cats}, "overall": _cell(n * len(cats), 0.0)}}
    thirteen = [f"c{i}" for i in range(13)]
    assert real_card.spec_bench_scope(per_cat(10, thirteen)).startswith("The first 10 prompts of each of its 13")
    full = {"ar": {**{f"m{i}": _cell(10, 0.0) for i in range(8)}, **{f"b{i}": _cell(80, 0.0) for i in range(5)}}}
    assert real_card.spec_bench_scope(full) == "All 480 prompts"
    assert real_card.spec_bench_scope(per_cat(1, thirteen)).startswith("The first prompt of each of its 13")
    assert real_card.spec_bench_scope({"ar": {"a": _cell(3, 0.0), "b": _cell(5, 0.0)}}) == "8 prompts"


def test_a_continued_run_lists_every_stage_and_the_minutes_of_all(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    (first / "args.json").write_text(json.dumps({"accum": 8, "train_layers": 6, "lr": 0.001, "epochs": 2.0}))
    (first / "log.jsonl").write_text(json.dumps({"step": 380, "minutes": 43.5, "noisy": 2.9, "clean": 0.2}) + "\n")
    (second / "args.json").write_text(json.dumps({"accum": 8, "train_layers": 6, "lr": 0.002, "epochs": 1.5, "threads": 2,
                                                  "lora_rank": 32, "init": str(first / "latest.pt")}))
    (second / "log.jsonl").write_text("".join(json.dumps({"step": s, "minutes": 43.5 + s / 10, "noisy": 2.0, "clean": 0.1}) + "\n"
                                              for s in (1, 2, 428)))
    lines = real_card.training_lines(str(second), json.loads((second / "args.json").read_text()),
                                     [json.loads(x) for x in (second / "log.jsonl").read_text().splitlines()])
    assert lines[0].startswith("- 380 optimizer steps of 8 examples (2.0 epochs), top 6 layers train, lr 0.001")
    assert lines[1].startswith("- Then 428 optimizer steps of 8 examples (1.5 epochs), rank-32 LoRA (scale 1) on the top 6")
    assert lines[-1] == "86.3 training minutes in all on both threads of a 2-core AVX2 CPU."


def test_a_card_refreshed_without_its_run_keeps_the_training_section_and_stored_evaluations(tmp_path):
    """A new machine has no runs/: the card's training section and the summaries it was written
    from carry over, and a newly measured set replaces only its own table."""
    run = tmp_path / "run"
    (run / "curve").mkdir(parents=True)
    (run / "args.json").write_text(json.dumps({"accum": 8, "threads": 2, "train_layers": 6, "lr": 0.001}))
    (run / "log.jsonl").write_text(json.dumps({"step": 7, "minutes": 2.5, "noisy": 2.0, "clean": 0.2}) + "\n")
    (run / "curve" / "curve.json").write_text(json.dumps([{"snapshot": "step000007", "minutes": 2.5, "lossless": 1.3}]))
    intro = tmp_path / "intro.md"
    intro.write_text("# card")
    cats = lambda tpf: {"ar": {"qa": _cell(10, 0.0), "overall": _cell(10, 0.0)},
                        "mars-0.9": {"qa": _cell(10, 0.0, tpf, 0.5), "overall": _cell(10, 0.0, tpf, 0.5)}}
    known = _summary(tmp_path / "known", {"ar": {"known-answers": _cell(40, 0.7)}})
    out = tmp_path / "card"
    args = ["--intro", str(intro), "--out", str(out)]
    assert real_card.main(["--run", str(run), *args, "--known", known,
                           "--spec-bench", _summary(tmp_path / "sb", cats(1.11))]) == 0
    first = (out / "README.md").read_text()
    config = (out / "training_config.json").read_text()
    assert "7 optimizer steps" in first and "| step000007 | 2.5 | 1.300 |" in first and "1.11 (50%)" in first
    assert real_card.main(args) == 0
    assert (out / "README.md").read_text() == first and (out / "training_config.json").read_text() == config
    assert real_card.main([*args, "--spec-bench", _summary(tmp_path / "sb2", cats(1.23))]) == 0
    second = (out / "README.md").read_text()
    assert second == first.replace("1.11 (50%)", "1.23 (50%)")
    assert json.loads((out / "eval_summaries.json").read_text())["known"]["ar"]["known-answers"]["accuracy"] == 0.7


def test_a_card_without_a_run_or_an_earlier_card_is_refused_in_one_line(tmp_path, capsys):
    intro = tmp_path / "intro.md"
    intro.write_text("# card")
    try:
        real_card.main(["--intro", str(intro), "--out", str(tmp_path / "card")])
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("a card with no training record was written")
    assert "--run" in capsys.readouterr().err


def test_a_run_continued_from_the_shipped_folder_keeps_that_cards_record_and_adds_its_own(tmp_path):
    """`gated_stage --init assets/models/<name>`: the earlier run is gone on this machine, so its card's
    training section stays as written; this run's stage, the CPU-minutes of both and its curve follow,
    once however often the card is refreshed, and training_config.json carries the CPU-minutes on."""
    out = tmp_path / "card"
    out.mkdir()
    (out / "README.md").write_text("# old\n\n## Training (measured)\n\n- 1295 optimizer steps, soft targets.\n\n"
                                   "353 CPU-minutes in all.\n\n### Training curve\n\n| step 1295 | 352.8 | 1.496 |\n\n"
                                   "## Quality where it can be checked\n")
    (out / "training_config.json").write_text(json.dumps({"cpu_minutes": 353.0}))
    run = tmp_path / "hard"
    (run / "curve").mkdir(parents=True)
    (run / "args.json").write_text(json.dumps({"init": str(out), "targets": "hard", "accum": 8, "rank": 16,
                                               "lr": 0.001, "epochs": 1.0, "threads": 2, "block_size": 4}))
    (run / "log.jsonl").write_text("".join(json.dumps({"step": s, "minutes": s, "cpu_minutes": 353.0 + s, "hard": 1.5}) + "\n"
                                           for s in (1, 153, 200)))
    (run / "curve" / "curve.json").write_text(json.dumps([{"snapshot": "step 153", "minutes": 506.0, "cpu": True, "chain all": 1.79},
                                                          {"snapshot": "step 200", "minutes": 553.0, "cpu": True, "chain all": 1.8}]))
    intro = tmp_path / "intro.md"
    intro.write_text("# card")
    args = ["--run", str(run), "--step", "153", "--intro", str(intro), "--out", str(out),
            "--known", _summary(tmp_path / "known", {"ar": {"known-answers": _cell(40, 0.7)}})]
    assert real_card.main(args) == 0
    card = (out / "README.md").read_text()
    assert "- 1295 optimizer steps, soft targets." in card and "| step 1295 | 352.8 | 1.496 |" in card
    assert card.count(real_card.CONTINUED) == 1 and "Then 153 optimizer steps of 8 examples" in card
    assert "506 CPU-minutes in all, every stage" in card and "| step 153 | 506.0 | 1.790 |" in card
    assert "step 200" not in card and card.index("1.496") < card.index(real_card.CONTINUED)
    assert json.loads((out / "training_config.json").read_text())["cpu_minutes"] == 506.0
    assert real_card.main(args) == 0
    assert (out / "README.md").read_text() == card
