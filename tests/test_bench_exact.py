"""The exact rows of `python -m benchmarks.bench` (mars-lossless, spec, spec-mars, hf-assisted)."""
import json

import pytest

from benchmarks import bench
from test_bench import args, models  # noqa: F401  (the fixture: tiny random models on disk)

EXACT = ("hf-generate-mars,mars-lossless,mars-lossless-tree,mars-lossless-tree-lookup,mars-lossless-budget,"
         "spec,spec-mars,hf-assisted")


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
                                         ("mars-lossless-tree", ["--draft-tree", "2,2,2,2"]),
                                         ("mars-lossless-budget", ["--draft-budget", "4,9"])])
def test_bad_draft_tokens_exit_2(models, tmp_path, method, bad, capsys):  # noqa: F811
    try:
        code = bench.main(args(models, tmp_path, "--methods", method, *bad))
    except SystemExit as e:  # argparse's error
        code = e.code
    assert code == 2
    assert "draft" in capsys.readouterr().err


def test_the_compiled_exact_rows_and_fastest_exact_reproduce_ar(models, tmp_path, monkeypatch):  # noqa: F811
    """Compiled rows run their steps as they are here (torch.compile itself is tested in
    test_compiled_lossless); fastest-exact's choice is made once per batch size, in the warm-up."""
    from mars_core import decode_shaped, fastest
    monkeypatch.setattr(decode_shaped, "compiled", lambda fn, mode: fn)
    monkeypatch.setenv("MARS_CACHE", str(tmp_path / "cache"))
    chosen = []
    real = fastest.fastest_exact

    def spy(*a, **kw):
        chosen.append(kw["batch_size"])
        return real(*a, **kw)
    import benchmarks.methods_exact as me
    monkeypatch.setattr(me, "fastest_exact", spy)
    extra = ["--methods", "hf-generate-mars,mars-lossless-tree-compiled,mars-lossless-budget-lookup-compiled,fastest-exact",
             "--taus", "1"]
    assert bench.main(args(models, tmp_path, *extra)) == 0
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert {r["method"] for r in runs} >= {"fastest-exact", "mars-lossless-budget-lookup-compiled"}
    for r in runs:
        assert r["status"] == "ok" and r["same_as_ref"] == 1.0, r
    assert sorted(chosen) == sorted(set(chosen)) and chosen  # once per batch size
