"""bf16 on a CPU only where it is native: flag detection and the dtype `load_model` picks."""
import warnings

import pytest
import torch

from conftest import make_model
from mars_core import cpu, load_model

X86_NO_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw\n"
X86_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_flags_are_read_from_x86_and_arm_cpuinfo():
    assert "avx512_bf16" not in cpu.cpu_flags(X86_NO_BF16) and "avx512f" in cpu.cpu_flags(X86_NO_BF16)
    assert "avx512_bf16" in cpu.cpu_flags(X86_BF16)
    assert "bf16" in cpu.cpu_flags(ARM_BF16)
    assert cpu.cpu_flags("") == set()


@pytest.mark.parametrize("requested,native,want,noted", [
    ("bfloat16", True, torch.bfloat16, False),
    ("bfloat16", False, torch.float32, True),
    ("auto", True, torch.bfloat16, False),
    ("auto", False, torch.float32, False),
    ("float32", True, torch.float32, False),
    ("float16", False, torch.float16, False),
])
def test_cpu_dtype_falls_back_only_without_native_bf16(requested, native, want, noted):
    dtype, note = cpu.cpu_dtype(requested, native=native)
    assert dtype == want
    assert (note is not None) == noted
    if noted:
        assert "no native bf16" in note and "float32" in note


@pytest.fixture
def model_dir(tmp_path, tokenizer):
    model = make_model("qwen2", len(tokenizer))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return str(tmp_path)


def test_load_model_says_when_it_falls_back(model_dir, monkeypatch):
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="no native bf16"):
        model, _ = load_model(model_dir, dtype="bfloat16", device="cpu")
    assert model.dtype == torch.float32 and "float32" in model.mars_dtype_note


def test_load_model_uses_bf16_where_native_and_a_torch_dtype_as_given(model_dir, monkeypatch):
    monkeypatch.setattr(cpu, "native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, _ = load_model(model_dir, dtype="bfloat16", device="cpu")
    assert model.dtype == torch.bfloat16 and model.mars_dtype_note is None
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)
    model, _ = load_model(model_dir, dtype=torch.bfloat16, device="cpu")  # forced: measured as asked
    assert model.dtype == torch.bfloat16 and model.mars_dtype_note is None
