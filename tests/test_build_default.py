"""`python -m training.build_default --smoke` runs the whole chain and leaves loadable models."""
import json
import os

from mars_core import DecodeConfig, generate, load_model
from training.build_default import main


def test_smoke_build_then_resume_is_a_no_op(tmp_path):
    out = tmp_path / "build"
    assert main(["--smoke", "--output", str(out), "--threads", "2", "--install", str(tmp_path / "assets")]) == 0
    for name in ("tiny-ar-sft", "tiny-mars-b4"):
        model, tok = load_model(str(tmp_path / "assets" / name), device="cpu")
        assert generate(model, tok, ["What is 12 + 30?"], DecodeConfig(max_new_tokens=4)).stats.tokens > 0
        assert "## Results" in (out / name / "README.md").read_text()
        assert not os.path.exists(tmp_path / "assets" / name / "checkpoints")
    result = json.loads((out / "eval" / "eval.json").read_text())
    assert {r["mode"] for r in result["runs"]} == {"ar", "mars"}
    assert json.loads((out / "eval" / "ablations.json").read_text())["runs"]
    before = (out / "build.json").stat().st_mtime_ns
    assert main(["--smoke", "--output", str(out)]) == 0  # everything complete: only re-evaluated cards
    assert json.loads((out / "tiny-mars-b4" / "training_config.json").read_text())["status"] == "finished"
    assert (out / "build.json").stat().st_mtime_ns >= before
