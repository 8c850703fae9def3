"""`python -m benchmarks.bench` end to end on tiny random models saved to a temporary folder."""
import json

import pytest

from conftest import make_model, make_tokenizer
from benchmarks import bench, methods

FAST = "hf-generate,ar,ar-cursor,hf-prompt-lookup,mars-nocache,mars-sliding,mars-block,mars-cursor"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tok = make_tokenizer()
    paths = {}
    for name, seed, scale in (("ar", 0, 1.0), ("mars", 1, 30.0)):
        m = make_model("qwen2", len(tok), seed=seed, head_scale=scale)
        m.generation_config.eos_token_id = tok.eos_token_id
        m.generation_config.pad_token_id = tok.pad_token_id
        m.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        paths[name] = str(root / name)
    return paths


def args(models, out, *extra):
    return ["--ar-model", models["ar"], "--mars-model", models["mars"], "--n", "3", "--batch-sizes", "1,2",
            "--taus", "0.5", "--max-new-tokens", "6", "--repeats", "2", "--threads", "1",
            "--cache-block-sizes", "4,8", "--output", str(out), *extra]


def test_bench_end_to_end(models, tmp_path, capsys):
    assert bench.main(args(models, tmp_path, "--methods", FAST)) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "bench.json").read_text())
    assert (tmp_path / "bench.html").read_text().count("plotly") > 0
    md = (tmp_path / "bench.md").read_text()
    names = ["hf-generate", "ar", "ar-cursor", "hf-prompt-lookup", "mars-nocache", "mars-sliding",
             "mars-block-4", "mars-block-8", "mars-cursor"]
    runs = result["runs"]
    assert {(r["method"], r["batch_size"]) for r in runs} == {(n, b) for n in names for b in (1, 2)}
    for r in runs:
        assert r["status"] == "ok", r
        assert r["tokens"] > 0 and r["tokens_per_second"] > 0 and r["tokens_per_forward"] >= 1.0 - 1e-9
        assert len(r["seconds_all"]) == 2 and r["speedup"] > 0 and r["accuracy"] is not None
        assert f"| {r['method']} |" in md and f"| {r['method']} |" in printed
        # every cache mode gives the reference's tokens; every AR method gives HF greedy's
        assert r["same_as_ref"] == 1.0, r["method"]
    for b in (1, 2):
        base = [r for r in runs if r["batch_size"] == b and r["method"] == r["baseline"]]
        assert len(base) == 1 and base[0]["method"] in methods.ar_baselines() and base[0]["speedup"] == 1.0
    assert result["environment"]["threads"] == 1 and result["n_prompts"] == 3
    assert any("tokens/s" in n for n in result["notes"])


def test_failing_optional_method_is_reported_not_fatal(models, tmp_path, monkeypatch):
    real = methods._hf_batch

    def broken(model, ids, pad_id, stop, max_new, **kw):
        if "cache_implementation" in kw:
            raise RuntimeError("no compiler here")
        return real(model, ids, pad_id, stop, max_new, **kw)

    monkeypatch.setattr(methods, "_hf_batch", broken)
    assert bench.main(args(models, tmp_path, "--methods", "hf-generate,ar-static-compile", "--batch-sizes", "1")) == 0
    runs = {r["method"]: r for r in json.loads((tmp_path / "bench.json").read_text())["runs"]}
    assert runs["hf-generate"]["status"] == "ok"
    assert runs["ar-static-compile"]["status"] == "not available"
    assert "no compiler here" in runs["ar-static-compile"]["reason"]
    assert "not available" in (tmp_path / "bench.md").read_text()


def test_prompts_file(models, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "What is 2 + 2?", "answer": "4"}\n{"prompt": "Hi"}\n')
    assert bench.main(args(models, tmp_path / "o", "--prompts", str(f), "--methods", "ar,mars-cursor",
                           "--batch-sizes", "2")) == 0
    result = json.loads((tmp_path / "o" / "bench.json").read_text())
    assert result["n_prompts"] == 2 and all(r["status"] == "ok" for r in result["runs"])


@pytest.mark.parametrize("bad", [
    ["--batch-sizes", "0"], ["--batch-sizes", "a,b"], ["--taus", "1.5"], ["--methods", "mars-turbo"],
    ["--repeats", "0"], ["--n", "0"], ["--threads", "0"], ["--max-new-tokens", "-1"],
    ["--cache-block-sizes", "2", "--methods", "mars-block"],
])
def test_bad_input_exits_2(models, tmp_path, bad, capsys):
    try:
        code = bench.main(args(models, tmp_path, *bad))
    except SystemExit as e:
        code = e.code
    assert code == 2
    assert "error" in capsys.readouterr().err


def test_missing_model_and_bad_prompts_exit_2(models, tmp_path, capsys):
    assert bench.main(args(models, tmp_path, "--ar-model", str(tmp_path / "nope"), "--methods", "ar")) == 2
    assert "nope" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert bench.main(args(models, tmp_path, "--prompts", str(bad), "--methods", "ar")) == 2
    assert "JSONL" in capsys.readouterr().err


def test_prompt_too_long_for_the_model_exits_2(models, tmp_path, capsys):
    from mars_core.loading import load_tokenizer
    from mars_core.prompts import encode_prompt
    from tasks.synthetic import make_examples

    # 512 positions: the prompt + the new tokens + the AR step's 1 fit exactly; a MARS block of 4 does not
    prompt = make_examples(1, 0, "eval")[0]["messages"][0]["content"]
    new = 512 - len(encode_prompt(load_tokenizer(models["ar"]), prompt)) - 1
    one = ["--n", "1", "--batch-sizes", "1", "--repeats", "1", "--max-new-tokens", str(new)]
    assert bench.main(args(models, tmp_path, "--methods", "ar", *one)) == 0
    assert bench.main(args(models, tmp_path, "--methods", "mars-cursor", *one)) == 2
    assert "the mars model: prompt" in capsys.readouterr().err


def test_mars_rows_accept_several_tokens_per_forward(models, tmp_path):
    assert bench.main(args(models, tmp_path, "--methods", "ar,mars-sliding,mars-cursor", "--batch-sizes", "2",
                           "--max-new-tokens", "12")) == 0
    runs = {r["method"]: r for r in json.loads((tmp_path / "bench.json").read_text())["runs"]}
    assert runs["ar"]["tokens_per_forward"] == 1.0
    assert runs["mars-cursor"]["tokens_per_forward"] > 1.0
    assert runs["mars-cursor"]["tokens_per_forward"] == runs["mars-sliding"]["tokens_per_forward"]


def test_profiling_reports_forward_share_and_top_ops(models, tmp_path, capsys):
    from benchmarks import profiling

    out = tmp_path / "profile.txt"
    assert profiling.main(["--method", "mars-cursor", "--ar-model", models["ar"], "--mars-model", models["mars"],
                           "--batch-size", "2", "--tau", "0.5", "--max-new-tokens", "6", "--threads", "1",
                           "--top", "5", "--output", str(out)]) == 0
    report = out.read_text()
    assert report.startswith("mars-cursor batch 2 tau 0.5 float32:") and "inside model.forward:" in report
    assert "Self CPU" in report and report.strip() in capsys.readouterr().out


def test_profiling_bad_method_is_a_clear_error(models, capsys):
    from benchmarks import profiling

    with pytest.raises(SystemExit) as e:
        profiling.main(["--method", "nope", "--ar-model", models["ar"], "--mars-model", models["mars"]])
    assert e.value.code == 2 and "unknown method" in capsys.readouterr().err


def test_compiled_rows_count_calls_without_hooks_and_match_eager(models, tmp_path, monkeypatch):
    """ar-compiled / mars-compiled run the static-shape path (its step run uncompiled here: a real
    compile costs tens of seconds per graph on this CPU; test_compiled.py compiles once). A forward
    hook inside a compiled graph would recompile every run, so the runner counts the calls: they
    must be the eager cursor rows' counts, and the tokens the references'."""
    from mars_core import decode_compiled as dc

    monkeypatch.setattr(dc, "compiled", lambda fn, mode: fn)
    names = "hf-generate,ar-cursor,ar-compiled,mars-nocache,mars-cursor,mars-compiled"
    assert bench.main(args(models, tmp_path, "--methods", names)) == 0
    runs = {(r["method"], r["batch_size"]): r for r in json.loads((tmp_path / "bench.json").read_text())["runs"]}
    for b in (1, 2):
        for compiled, eager in (("ar-compiled", "ar-cursor"), ("mars-compiled", "mars-cursor")):
            c, e = runs[(compiled, b)], runs[(eager, b)]
            assert c["status"] == "ok" and c["same_as_ref"] == 1.0
            assert c["model_calls"] == e["model_calls"] > 0 and c["tokens"] == e["tokens"]
            assert c["graphs_timed"] == 0
        assert runs[("ar-compiled", b)]["baseline"] in methods.ar_baselines()
    assert {"ar-static-compile", "ar-compiled"} <= set(methods.ar_baselines())


def test_a_row_whose_repetitions_disagree_is_named_in_the_notes():
    """The 2026-12-06 run whose first repetition was 40% slow in two rows: the report says so."""
    from benchmarks.report import table

    def row(method, secs):
        return dict(batch_size=1, method=method, model="ar", tau=None, status="ok", seconds=sorted(secs)[len(secs) // 2],
                    seconds_all=secs, tokens=96, tokens_per_second=1.0, tokens_per_forward=1.0, model_calls=96,
                    accuracy=None, same_as_ref=None, speedup=1.0, baseline="ar")
    result = dict(runs=[row("ar", [22.9, 16.3]), row("hf-generate", [31.1, 29.5])], notes=[], n_prompts=8,
                  settings=dict(max_new_tokens=96, block_size=4, repeats=2),
                  environment=dict(torch="t", transformers="t", threads=2, device="cpu"))
    md = table(result)
    assert "ar at batch 1: 22.90, 16.30 s" in md and "hf-generate at batch 1" not in md
    result["runs"] = [row("ar", [16.4, 17.0, 16.1])]
    assert "disagree" not in table(result)
