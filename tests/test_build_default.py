"""`python -m training.build_default --smoke` runs the whole chain and leaves loadable models."""
import json
import os

import pytest

from mars_core import DecodeConfig, generate, load_model
from training.build_default import Recipe, cached_eval, main, stage
from training.train_config import TrainConfig


def test_smoke_build_then_resume_is_a_no_op(tmp_path, capsys):
    out = tmp_path / "build"
    assert main(["--smoke", "--output", str(out), "--threads", "2", "--install", str(tmp_path / "assets")]) == 0
    for name in ("tiny-ar-sft", "tiny-mars-b4", "tiny-draft"):
        model, tok = load_model(str(tmp_path / "assets" / name), device="cpu")
        assert generate(model, tok, ["What is 12 + 30?"], DecodeConfig(max_new_tokens=4)).stats.tokens > 0
        assert "## Results" in (out / name / "README.md").read_text()
        assert not os.path.exists(tmp_path / "assets" / name / "checkpoints")
    draft = json.loads((out / "tiny-draft" / "eval.json").read_text())
    runs = {r["run"]: r for r in draft["runs"]}
    assert runs["spec, this draft"]["draft_acceptance"] is not None and runs["spec, this draft"]["draft_forwards"] > 0
    assert "spec, the same-size AR model as draft" in (out / "tiny-draft" / "README.md").read_text()
    result = json.loads((out / "eval" / "eval.json").read_text())
    assert {r["mode"] for r in result["runs"]} == {"ar", "mars"}
    assert json.loads((out / "eval" / "ablations.json").read_text())["runs"]
    ablation = json.loads((out / "ablations" / "mars-b4-no-sft" / "training_config.json").read_text())
    assert (ablation["ar_weight"], ablation["steps"]) == (0.0, Recipe.smoke().ablation_steps)
    # everything complete: the second run trains and evaluates nothing and rewrites nothing
    kept = sorted(p for p in out.rglob("*") if p.is_file())
    assert {out / "eval" / "eval.json", out / "eval" / "frontier.html", out / "build.json",
            out / "tiny-mars-b4" / "README.md", out / "tiny-mars-b4" / "model.safetensors"} <= set(kept)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in kept}
    capsys.readouterr()
    assert main(["--smoke", "--output", str(out)]) == 0
    log = capsys.readouterr().out
    assert "[train]" not in log and "[tokenizer]" not in log and log.count("[skip]") == 4
    assert sorted(p for p in out.rglob("*") if p.is_file()) == kept
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in kept} == before
    # A finished stage of another recipe is refused, not silently reused.
    record = json.loads((out / "tiny-mars-b4" / "training_config.json").read_text())
    args = record["args"]  # dataclasses.asdict of the run's TrainConfig
    changed = TrainConfig(**{**args, "ar_weight": 2.0})
    with pytest.raises(ValueError, match=r"another recipe \(ar_weight: 1.0 -> 2.0\)"):
        stage(changed, log=lambda _: None)
    assert stage(TrainConfig(**args), log=lambda _: None)["status"] == "finished"


def test_cached_eval_is_keyed_on_weights_and_settings(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights v1")
    calls = []

    def run():
        calls.append(1)
        return {"runs": [len(calls)]}

    path = str(tmp_path / "eval" / "eval.json")
    assert cached_eval(path, {"m": str(model)}, {"n": 5}, run)["runs"] == [1]
    assert cached_eval(path, {"m": str(model)}, {"n": 5}, run)["runs"] == [1]  # reused
    assert cached_eval(path, {"m": str(model)}, {"n": 6}, run)["runs"] == [2]  # other settings
    (model / "model.safetensors").write_bytes(b"weights v2")  # a retrained model
    assert cached_eval(path, {"m": str(model)}, {"n": 6}, run)["runs"] == [3]
