"""The exact rows of `python -m benchmarks.bench` (mars-lossless, spec, spec-mars, hf-assisted)."""
import json

import pytest

from benchmarks import bench
from test_bench import args, models  # noqa: F401  (the fixture: tiny random models on disk)

EXACT = "hf-generate-mars,mars-lossless,mars-lossless-tree,mars-lossless-tree-lookup,spec,spec-mars,hf-assisted"


def test_exact_rows_reproduce_ar(models, tmp_path):  # noqa: F811
    extra = ["--methods", EXACT, "--taus", "1,0.5", "--draft-model", models["ar"], "--draft-tokens", "3"]
    assert bench.main(args(models, tmp_path, *extra)) == 0
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    seen = {(r["method"], r["tau"], r["batch_size"]) for r in runs}
    assert ("spec-mars", 0.5, 2) in seen and ("spec-mars", 1.0, 1) in seen and ("hf-assisted", None, 2) in seen
    for r in runs:
        assert r["status"] == "ok", r
        if r["tau"] != 0.5:  # everything but the tau-accepted extras is exact
            assert r["same_as_ref"] == 1.0, (r["method"], r["tau"], r["batch_size"])
        assert r["tokens_per_forward"] >= 1.0 - 1e-9


@pytest.mark.parametrize("method, bad", [("spec", ["--draft-tokens", "0"]), ("spec", ["--draft-tokens", "40"]),
                                         ("mars-lossless-tree", ["--draft-tree", "2,2,2,2"])])
def test_bad_draft_tokens_exit_2(models, tmp_path, method, bad, capsys):  # noqa: F811
    try:
        code = bench.main(args(models, tmp_path, "--methods", method, *bad))
    except SystemExit as e:  # argparse's error
        code = e.code
    assert code == 2
    assert "draft" in capsys.readouterr().err
