"""benchmarks.mask_replay: the replayed tokens per forward of a config equal the decoder's own on
the same AR outputs (the bundled model, several prompts), and a gated snapshot is read."""
import json
import os

import pytest
import torch

from benchmarks import mask_replay, real_eval
from test_bundled_models import ROOT

BUNDLED = os.path.join(ROOT, "tiny-mars-b4")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    with open(tmp / "p.jsonl", "w") as f:
        for i, q in enumerate(["What is the sum of [58, 64, 50, 37]?", "Sort [5, 3, 9, 1, 7] ascending.",
                               "Tom has 12 apples. Tom has 12 apples. Tom has"]):
            f.write(json.dumps({"id": i, "prompt": q}) + "\n")
    assert real_eval.main(["--model", BUNDLED, "--prompts", str(tmp / "p.jsonl"), "--taus", "", "--max-new-tokens", "40",
                           "--prompt-lookup", "2", "--prompt-lookup-tokens", "10", "--out", str(tmp / "run")]) == 0
    return tmp


def test_replayed_tokens_per_forward_are_the_decoders(run):
    assert mask_replay.main(["--run", str(run / "run"), "--prompts", str(run / "p.jsonl"), "--model", BUNDLED,
                             "--out", str(run / "r.json")]) == 0
    got = json.loads((run / "r.json").read_text())
    decoded = real_eval.summarise(str(run / "run" / "outputs.jsonl"))
    assert got["chain all"] == pytest.approx(decoded["lossless"]["overall"]["tokens_per_forward"], abs=1e-3)
    assert got["chain last + lookup"] != got["chain last"]  # the repeating prompt copies
    assert got["chain all + lookup"] == pytest.approx(
        decoded["lossless-lookup2-L10"]["overall"]["tokens_per_forward"], abs=1e-3)
    assert 0.0 < got["top1 by distance"][0] <= 1.0 and len(got["top1 by distance"]) == 3


def test_a_gated_snapshot_is_read_on_the_model(run, tmp_path):
    from mars_core import load_model
    from mars_core.gate import attach_gate, gate_state

    model, tok = load_model(BUNDLED)
    params = attach_gate(model, tok.mask_token_id, rank=2, trainable=True)
    with torch.no_grad():
        for p in params:
            p.normal_(0, 1.0)
    torch.save({"gate": gate_state(model), "state": {}}, tmp_path / "snap.pt")
    assert mask_replay.main(["--run", str(run / "run"), "--prompts", str(run / "p.jsonl"), "--model", BUNDLED,
                             "--layers", str(tmp_path / "snap.pt"), "--out", str(tmp_path / "r.json")]) == 0
    plain = json.loads((run / "r.json").read_text()) if (run / "r.json").exists() else None
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["layers"].endswith("snap.pt") and (plain is None or got["chain last"] != plain["chain last"])


def test_a_curve_of_a_gated_runs_snapshots(run, tmp_path):
    from mars_core import load_model
    from mars_core.gate import attach_gate, gate_state

    model, tok = load_model(BUNDLED)
    params = attach_gate(model, tok.mask_token_id, rank=2, trainable=True)
    (tmp_path / "g" / "snapshots").mkdir(parents=True)
    for step, scale in ((10, 0.0), (20, 1.0)):
        with torch.no_grad():
            for p in params:
                p.normal_(0, scale) if scale else p.zero_()
        torch.save({"gate": gate_state(model), "state": {"step": step, "cpu_minutes": step / 10}},
                   tmp_path / "g" / "snapshots" / f"step{step:06d}.pt")
    assert mask_replay.main(["--run", str(run / "run"), "--prompts", str(run / "p.jsonl"), "--model", BUNDLED,
                             "--curve", str(tmp_path / "g")]) == 0
    points = json.loads((tmp_path / "g" / "curve" / "curve.json").read_text())
    assert [p["snapshot"] for p in points] == ["step 10", "step 20"] and points[1]["minutes"] == 2.0
    plain = json.loads((run / "r.json").read_text()) if (run / "r.json").exists() else None
    if plain is not None:  # a zero gate is the model as it is
        assert points[0]["chain all"] == plain["chain all"] and points[1]["chain all"] != plain["chain all"]


def test_by_distance_counts_top1_and_the_previous_token_from_the_rule():
    from types import SimpleNamespace

    text = [5, 6, 7, 7, 8, 9]  # first = 1: rows for t = 1..5, mask m after text[:t + 1] predicts text[t + 2 + m]
    ids = [[[7], [6]],  # t=1: d2 -> text[3]=7 right; d3 -> text[4]=8, says 6 (not the previous 7)
           [[7], [7]],  # t=2: d2 -> text[4]=8, says 7 = previous (counted); d3 -> text[5]=9, says 7 (previous is 8)
           [[8], [8]],  # t=3: d2 -> text[5]=9, says 8 = previous; d3: no target
           [[0], [0]], [[0], [0]]]
    got = mask_replay.by_distance([SimpleNamespace(first=1, text=text, ids=ids)], 3)
    assert got["top1 by distance"] == [round(1 / 3, 4), 0.0]
    # d2 targets text[3..5] = 7, 8, 9 with previous 7, 7, 8: the first is a repeat (not counted)
    assert got["says previous by distance"] == [1.0, 0.0]


def test_a_distill_files_answers_replay_as_the_same_answers_of_a_run(run, tmp_path):
    """The run's AR answers written as a distill file under held-out ids (0, 20, 40), beside trained-on
    ids whose answers differ: --split dev replays exactly what --run replays, --split train the rest."""
    from mars_core import load_model
    from mars_core.prompts import encode_prompt

    _, tok = load_model(BUNDLED)
    prompts = [json.loads(line) for line in open(run / "p.jsonl")]
    ars = [r for r in map(json.loads, open(run / "run" / "outputs.jsonl")) if r["setting"] == "ar"]
    with open(tmp_path / "d.jsonl", "w") as f:
        for r in ars:
            ids = encode_prompt(tok, prompts[r["id"]]["prompt"])
            for rid, answer in ((20 * r["id"], r["ids"]), (20 * r["id"] + 1, r["ids"][::-1])):
                f.write(json.dumps({"id": rid, "prompt": "p", "prompt_ids": ids, "response_ids": answer,
                                    "ended": r["forwards"] > r["tokens"], "response": "r"}) + "\n")
    common = ["--model", BUNDLED, "--distill", str(tmp_path / "d.jsonl"), "--max-new-tokens", "40"]
    assert mask_replay.main([*common, "--out", str(tmp_path / "dev.json")]) == 0
    assert mask_replay.main([*common, "--split", "train", "--out", str(tmp_path / "train.json")]) == 0
    if not (run / "r.json").exists():
        assert mask_replay.main(["--run", str(run / "run"), "--prompts", str(run / "p.jsonl"), "--model", BUNDLED,
                                 "--out", str(run / "r.json")]) == 0
    plain, dev, train = (json.loads(p.read_text()) for p in (run / "r.json", tmp_path / "dev.json", tmp_path / "train.json"))
    assert dev["split"] == "dev" and dev["n"] == train["n"] == 3
    for k in mask_replay.CONFIGS:
        assert dev[k] == plain[k], k
    assert train["chain all"] != plain["chain all"]
    with pytest.raises(SystemExit):  # argparse's message: a run and a distill file are two sources
        mask_replay.main(["--run", str(run / "run"), *common, "--out", str(tmp_path / "x.json")])


def test_each_category_replays_as_its_answers_alone(run, tmp_path):
    """Categories a, b, a: "by category" of the whole run equals a replay of each category's answers
    on their own (a run file holding only them), and --per-category 1 keeps the first of each."""
    cats = {0: "a", 1: "b", 2: "a"}
    lines = [json.loads(line) for line in open(run / "p.jsonl")]
    with open(tmp_path / "p.jsonl", "w") as f:
        f.writelines(json.dumps({**r, "category": cats[r["id"]]}) + "\n" for r in lines)
    ars = [{**r, "category": cats[r["id"]]} for r in map(json.loads, open(run / "run" / "outputs.jsonl"))
           if r["setting"] == "ar"]
    for name, keep in (("all", ("a", "b")), ("a", ("a",)), ("b", ("b",))):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / "outputs.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in ars if r["category"] in keep)
    common = ["--prompts", str(tmp_path / "p.jsonl"), "--model", BUNDLED]
    for name in ("all", "a", "b"):
        assert mask_replay.main(["--run", str(tmp_path / name), *common, "--out", str(tmp_path / f"{name}.json")]) == 0
    whole, a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("all", "a", "b"))
    assert list(whole["by category"]) == ["a", "b"] and "by category" not in a
    for cat, alone in (("a", a), ("b", b)):
        assert whole["by category"][cat]["n"] == alone["n"]
        for k in (*mask_replay.CONFIGS, "top1 by distance"):
            assert whole["by category"][cat][k] == alone[k], (cat, k)
    assert a["chain all"] != b["chain all"]  # else the check above could not see a mixed-up slice
    assert mask_replay.main(["--run", str(tmp_path / "all"), *common, "--per-category", "1",
                             "--out", str(tmp_path / "one.json")]) == 0
    one = json.loads((tmp_path / "one.json").read_text())
    assert one["n"] == 2 and {c: v["n"] for c, v in one["by category"].items()} == {"a": 1, "b": 1}
