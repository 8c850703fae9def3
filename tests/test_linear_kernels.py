"""benchmarks.linear_kernels: the table docs/cpu-kernels.md shows, and its one-line refusals."""
import pytest
import torch

from benchmarks import linear_kernels


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and torch.backends.mkl.is_available()),
                    reason="needs MKL and oneDNN")
def test_one_row_per_layer_and_one_cell_per_row_count(capsys):
    assert linear_kernels.main(["--rows", "1,3", "--calls", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "layer" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["1536 x 576", "576 x 1536", "49152 x 576"]
    assert all(len(cell.split(" / ")) == 2 for r in rows for cell in r.split("|")[2:6])


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--rows", "a,2"], ["--calls", "0"]])
def test_bad_arguments_are_refused_in_one_line(argv, capsys):
    with pytest.raises(SystemExit) as e:
        linear_kernels.main(argv)
    assert e.value.code == 2 and "--rows takes positive integers" in capsys.readouterr().err
