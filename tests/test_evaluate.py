"""The evaluation writes its JSON and frontier figure, and reports what it measured."""
import json

import pytest

from conftest import make_model
from training.evaluate import main, summary_table
from tasks.synthetic import make_examples
from training.tokenizer import build_tokenizer, corpus_from_examples


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    tok = build_tokenizer(corpus_from_examples(make_examples(200, 0)), 300)
    model = make_model("qwen2", len(tok), head_scale=20.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_evaluate_writes_json_and_figure(model_dir, tmp_path):
    out = tmp_path / "eval"
    rc = main(["--model", model_dir, "--ar-model", model_dir, "--n", "6", "--taus", "1.0,0.5",
               "--block-sizes", "2,4", "--max-new-tokens", "12", "--batch-size", "4", "--output", str(out)])
    assert rc == 0
    result = json.loads((out / "eval.json").read_text())
    assert (out / "frontier.html").stat().st_size > 1000
    runs = result["runs"]
    assert [r["mode"] for r in runs] == ["ar", "ar"] + ["mars"] * 4
    for r in runs:
        assert 0 <= r["accuracy"] <= 1 and set(r["accuracy_by_family"]) <= {"arithmetic", "units", "lists"}
        assert r["tokens"] > 0 and r["tokens_per_forward"] >= 1.0
    tau1 = [r for r in runs if r["mode"] == "mars" and r["tau"] == 1.0]
    assert all(r["matches_ar"] == 1.0 and r["tokens_per_forward"] == 1.0 for r in tau1)
    assert "| mars | mars | 4 | 0.5 |" in summary_table(result)


def test_evaluate_rejects_bad_input(model_dir, tmp_path, capsys):
    assert main(["--model", str(tmp_path / "nope"), "--n", "2", "--output", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--model", model_dir, "--taus", "1.5", "--n", "2", "--output", str(tmp_path)]) == 2
    with pytest.raises(SystemExit):
        main(["--model", model_dir, "--taus", "abc", "--output", str(tmp_path)])


def test_evaluate_offers_every_cache_mode(model_dir, tmp_path):
    from mars_core.config import CACHES

    for cache in CACHES:  # `--cache cursor` was missing from the choices once
        out = tmp_path / cache
        assert main(["--model", model_dir, "--n", "2", "--taus", "0.5", "--max-new-tokens", "4",
                     "--cache", cache, "--output", str(out)]) == 0
        assert {r["cache"] for r in json.loads((out / "eval.json").read_text())["runs"]} == {cache}


def test_frontier_labels_never_overlap_and_stay_on_hover():
    from training.evaluate import frontier_figure

    def run(mode, tau, tpf, acc, tps):
        return {"model": "m", "mode": mode, "tau": tau, "block_size": 1 if mode == "ar" else 4, "accuracy": acc,
                "tokens_per_forward": tpf, "tokens_per_second": tps}

    runs = [run("ar", 1.0, 1.0, 0.80, 300), run("mars", 1.0, 1.0, 0.81, 290), run("mars", 0.95, 3.30, 0.79, 420),
            run("mars", 0.9, 3.35, 0.785, 425), run("mars", 0.5, 3.80, 0.60, 480)]
    fig = frontier_figure({"n": 5, "runs": runs})
    acc = [tr for tr in fig.data if (tr.xaxis or "x") == "x"]
    shown = [(x, y, t) for tr in acc for x, y, t in zip(tr.x, tr.y, tr.text) if t]
    for i, (x1, y1, _) in enumerate(shown):  # no two labels closer than a label's size (x range 2.8, y 21)
        assert all(abs(x1 - x2) >= 0.12 * 2.8 or abs(y1 - y2) >= 0.12 * 21 for x2, y2, _ in shown[i + 1:])
    mars = next(tr for tr in acc if "MARS" in tr.name)
    assert list(mars.text) == ["", "τ=0.95", "", "τ=0.5"]  # tau 1 sits on the AR point, 0.9 on 0.95
    assert list(mars.hovertext) == ["τ=1.0", "τ=0.95", "τ=0.9", "τ=0.5"]
    ar = next(tr for tr in acc if "AR" in tr.name)
    assert list(ar.text) == ["AR"]  # drawn first, it keeps its label
