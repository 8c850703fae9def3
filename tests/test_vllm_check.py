"""benchmarks/vllm_check: the comparison it reports, and a clear exit where vLLM or a GPU is missing
(the recipes themselves need a GPU machine; docs/serving.md says they have not been run)."""
import importlib.util

from benchmarks.vllm_check import compare, main
from test_hub import BUNDLED


def test_compare_counts_equal_rows_and_finds_the_first_difference():
    expected = [[1, 2, 3], [4, 5, 6], [7, 8]]
    got = [[1, 2, 3, 0], [4, 9, 6], [7, 8, 0, 0]]  # 0 = EOS: vLLM keeps it, mars_core does not
    r = compare(expected, got, stop_ids={0})
    assert r["n"] == 3 and abs(r["equal"] - 1 / 3) < 1e-9
    assert [d["prompt"] for d in r["differences"]] == [1, 2]
    assert r["differences"][0]["first_difference"] == 1 and r["differences"][1]["first_difference"] == 2


def test_without_vllm_or_a_gpu_it_says_so(capsys):
    import pytest
    import torch
    if importlib.util.find_spec("vllm") is not None and torch.cuda.is_available():
        pytest.skip("vllm and a GPU are present here: run python -m benchmarks.vllm_check itself")
    assert main(["--model", str(BUNDLED)]) == 2
    err = capsys.readouterr().err
    assert "vllm is not installed" in err or "no CUDA device" in err
