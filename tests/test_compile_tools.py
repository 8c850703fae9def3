"""The compile measurement commands: `benchmarks.compiled_check` on a tiny model, and bad input.

The step runs uncompiled here (a real compile costs tens of seconds per graph on this CPU); what
these tests check is the commands' own logic: the comparison, the counts, the errors.
"""
import pytest

from benchmarks import compile_cost, compiled_check
from conftest import make_model, make_tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("m")
    tok = make_tokenizer()
    m = make_model("qwen2", len(tok), seed=1, head_scale=30.0)
    m.generation_config.eos_token_id = tok.eos_token_id
    m.save_pretrained(root)
    tok.save_pretrained(root)
    return str(root)


def test_compiled_check_compares_with_eager(folder, monkeypatch, capsys):
    from mars_core import decode_compiled as dc

    monkeypatch.setattr(dc, "compiled", lambda fn, mode: fn)
    assert compiled_check.main(["--model", folder, "--n", "3", "--max-new-tokens", "8", "--taus", "1.0,0.5",
                                "--batch-sizes", "1,2", "--threads", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |") or line.startswith("| 0.5 |")]
    assert len(rows) == 4 and all("100.0% (3 of 3)" in r for r in rows)


def test_compiled_check_reports_a_difference(folder, monkeypatch, capsys):
    """A compiled path that emits one token too few per step must show up as < 100%."""
    from mars_core import decode_compiled as dc

    real_cut = dc.cut

    def cut(tokens, n_acc, stop_ids, remaining):
        return real_cut(tokens, (n_acc - 1).clamp(min=1), stop_ids, remaining)

    monkeypatch.setattr(dc, "compiled", lambda fn, mode: fn)
    monkeypatch.setattr(dc, "cut", cut)
    assert compiled_check.main(["--model", folder, "--n", "3", "--max-new-tokens", "8", "--taus", "0.0",
                                "--batch-sizes", "1", "--threads", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0 |"))
    assert "100.0%" not in row


@pytest.mark.parametrize("argv", [["--methods", "turbo"], ["--n", "0"], ["--tau", "2"], ["--batch-size", "0"]])
def test_compile_cost_refuses_bad_input(argv, capsys):
    try:
        code = compile_cost.main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2 and "error" in capsys.readouterr().err


def test_compile_cost_table():
    start = {"ttft_s": 0.5, "first_chunk_s": 30.0, "all_s": 40.0, "graphs": 2}
    warm = dict(start, first_chunk_s=1.0, graphs=0)
    result = {"settings": {"n": 2, "batch_size": 1, "max_new_tokens": 8, "tau": 0.95, "threads": 2},
              "rows": [{"method": "mars-compiled", "cold": start, "disk_warm": warm, "in_process": warm,
                        "rss_loaded_mb": 400.0, "rss_peak_mb": 900.0, "gpu_peak_mb": None}]}
    text = compile_cost.table(result)
    assert "| mars-compiled | cold (empty compiler cache) | 0.50 | 30.00 | 40.00 | 2 | 900 | 500 |" in text
    assert text.count("| mars-compiled |") == 3


def test_profiling_times_the_compiled_step(folder, monkeypatch):
    """The compiled path cannot be timed by forward hooks: the profiler times its step instead."""
    import argparse

    from benchmarks import profiling
    from mars_core import decode_compiled as dc

    monkeypatch.setattr(dc, "compiled", lambda fn, mode: fn)
    a = argparse.Namespace(method="mars-compiled", ar_model=folder, mars_model=folder, batch_size=2, tau=0.5,
                           block_size=4, cache_block_size=16, metric="probability", max_new_tokens=8,
                           prompt_lookup_tokens=10, seed=0, threads=1, dtype="float32", top=5, output=None)
    report = profiling.profile(a)
    head = report.splitlines()[1]
    assert head.startswith("inside the compiled step (forward + acceptance):")
    share = int(head.split("(")[2].split("%")[0])
    assert 30 <= share <= 100
    assert dc.compiled(dc.static_step, "default") is dc.static_step  # restored
