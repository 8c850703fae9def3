"""benchmarks.step_parts: the harness runs every row and leaves a stacked gate as it found it."""
import pytest

from benchmarks import step_parts
from mars_core.gate import attach_gate, fuse_siblings, wrapped_layers
from test_frozen_layers import tiny_llama


def test_every_row_runs_and_the_stacked_adapters_come_back(capsys):
    ar, mars = tiny_llama(), tiny_llama()
    attach_gate(mars, 5, rank=2)
    fuse_siblings(mars)
    before = {k: m.siblings for k, m in wrapped_layers(mars).items()}
    times = step_parts.measure(ar, mars, 5, 0, block_size=4, nodes=3, groups=2, context=20, repeats=1, compile=False,
                               profile=3)
    assert list(times) == ["ar", "window", "step on the AR model", "step", "step, adapters unstacked"]
    assert all(t > 0 for t in times.values())
    assert {k: m.siblings for k, m in wrapped_layers(mars).items()} == before
    assert capsys.readouterr().out.count("operators by self CPU time") == 2


def test_a_bad_draft_is_refused_with_the_form(capsys):
    with pytest.raises(SystemExit):
        step_parts.main(["--ar-model", "x", "--mars-model", "y", "--draft", "6"])
    assert "nodes,groups such as 6,2" in capsys.readouterr().err
