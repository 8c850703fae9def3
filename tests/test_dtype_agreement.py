"""benchmarks.dtype_agreement: the pairwise table, and every greedy decoder agreeing in fp32."""
import json

from benchmarks import dtype_agreement
from test_frozen_layers import tiny_model_dir  # noqa: F401 (fixture)


def test_agreement_pairs_from_the_rule():
    rows = dtype_agreement.agreement({"a": [[1, 2, 3], [4, 5]], "b": [[1, 2, 3], [4, 6]], "c": [[1, 9, 3], [4, 5]]})
    by = {(r["a"], r["b"]): r for r in rows}
    assert by[("a", "b")]["identical"] == 0.5 and by[("a", "b")]["first_difference"] == 1
    assert by[("a", "c")]["identical"] == 0.5 and by[("b", "c")]["identical"] == 0.0
    assert by[("b", "c")]["first_difference"] == 1.0  # prompt 0 at 1, prompt 1 at 1


def test_every_greedy_decoder_agrees_in_fp32(tmp_path, tiny_model_dir, capsys):
    with open(tmp_path / "si.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"id": f"x{i}", "instruction": f"Sort the list {i} 45, 12 and then add", "instances": []}) + "\n")
    assert dtype_agreement.main(["--model", tiny_model_dir, "--dtype", "float32", "--self-instruct", str(tmp_path / "si.jsonl"),
                                 "--offset", "0", "--n", "4", "--max-new-tokens", "12", "--out", str(tmp_path / "o")]) == 0
    result = json.loads((tmp_path / "o" / "agreement.json").read_text())
    assert len(result["pairs"]) == 10 and all(r["identical"] == 1.0 for r in result["pairs"])
    assert "| hf-generate vs ar b1 | 100% | - |" in capsys.readouterr().out
