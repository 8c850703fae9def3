"""`python -m mars_core.export`: Hub-ready folders from the bundled model and from a synthetic
released-style (`a2d-qwen2`) checkpoint, the generated `custom_generate/` folder (in sync with
mars_core, importing nothing outside itself), a fresh Python process without mars_core, bad input."""
import ast
import filecmp
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

from conftest import make_model, make_tokenizer
from mars_core import DecodeConfig, load_model
from mars_core.export import export, main
from mars_core.export_card import method_card
from mars_core.export_method import method_files
from test_hub import BUNDLED, NEW, PROMPTS, ROOT, Puts, assert_lossless_through_folder, batch, expected

ALLOWED_PACKAGES = {"torch", "transformers"} | {"safetensors", "huggingface_hub"}  # transformers depends on both: a gated checkpoint reads its gate with them


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "tiny-mars-b4"
    try:
        summary = export(BUNDLED, out)
    except Exception as e:  # noqa: BLE001 - the export of the bundled model must work
        pytest.fail(f"the export of the bundled model failed: {e!r}")
    return out, summary


@pytest.fixture(scope="module")
def ref():
    return load_model(str(BUNDLED), device="cpu")


def outside_imports(folder: pathlib.Path) -> list[str]:
    """Imports of the .py files in `folder` that reach outside it: a relative import of a module
    the folder lacks, or an absolute one of anything but the standard library, torch, transformers."""
    bad = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                if node.level != 1 or not node.module or not (folder / f"{node.module}.py").is_file():
                    bad.append(f"{path.name}: from {'.' * node.level}{node.module or ''}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ALLOWED_PACKAGES:
                        bad.append(f"{path.name}: import {name}")
    return bad


def test_the_method_folder_carries_only_the_hub_path(tmp_path):
    """`--method-only` writes the generated folder (nothing generated is kept in git): the entry
    point, the modules it imports and no other decoder, nothing outside the folder imported."""
    main(["--method-only", str(tmp_path / "mars")])
    folder = tmp_path / "mars"
    want = dict(method_files(), **{"README.md": method_card()})
    have = {p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8") for p in folder.rglob("*") if p.is_file()}
    assert have == want
    names = {pathlib.Path(k).name for k in have}
    assert {"generate.py", "decode_cursor.py", "decode_exact.py", "decode_reference.py"} <= names
    assert not names & {"decode_block.py", "decode_sliding.py", "decode_compiled.py", "mars_generate.py"}
    assert outside_imports(folder / "custom_generate") == []
    assert not (ROOT / "hub").exists() or not _tracked(ROOT / "hub")


def _tracked(path: pathlib.Path) -> bool:
    out = subprocess.run(["git", "ls-files", str(path)], cwd=ROOT, capture_output=True, text=True)
    return bool(out.stdout.strip()) if out.returncode == 0 else False


def test_the_method_folder_imports_nothing_outside_itself(exported, tmp_path):
    assert outside_imports(exported[0] / "custom_generate") == []
    (tmp_path / "generate.py").write_text("from .decoding import Rows\nfrom mars_core import generate\n"
                                          "def f():\n    from training import x\n")
    assert outside_imports(tmp_path) == ["generate.py: from .decoding", "generate.py: import mars_core",
                                         "generate.py: import training"]


def test_export_of_the_bundled_model(exported):
    out, summary = exported
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    assert config.get("pard_token") == 5  # vLLM's parallel drafting reads the mask id from here
    assert filecmp.cmp(BUNDLED / "model.safetensors", out / "model.safetensors", shallow=False)
    assert sorted(p.name for p in (out / "custom_generate").iterdir() if p.is_file()) == sorted(
        pathlib.Path(k).name for k in method_files())
    tok = PreTrainedTokenizerFast.from_pretrained(str(out))
    assert tok.mask_token == "<|mask|>" and tok.mask_token_id == summary["mask_token_id"] == 5
    mars = GenerationConfig.from_pretrained(str(out)).mars
    assert mars == {"mode": "mars", "tau": 0.95, "block_size": 4, "mask_token_id": 5}
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "tags: [custom_generate, mars]" in card
    usage = card.split("```python\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(usage) == 5 and 'custom_generate="tiny-mars-b4"' in usage[3]
    runs = json.loads((BUNDLED / "eval.json").read_text())["runs"]
    table = card.split("## Evaluation", 1)[1].split("## Export", 1)[0]
    assert table.count("| mars | mars | 4 |") == sum(r["mode"] == "mars" for r in runs)
    assert "| 0.95 | 84.2% | 3.37 |" in table  # the tau = 0.95 run of eval.json


def test_exported_folder_decodes_like_mars_core(exported, ref):
    out, _ = exported
    model, tok = ref
    plain = AutoModelForCausalLM.from_pretrained(str(out))
    x, mask = batch(tok, PROMPTS)
    res = plain.generate(input_ids=x, attention_mask=mask, custom_generate=str(out), trust_remote_code=True,
                         max_new_tokens=NEW, tau=0.9, return_dict_in_generate=True)
    tail, counts = expected(model, tok, PROMPTS, DecodeConfig(tau=0.9, max_new_tokens=NEW))
    assert torch.equal(res.sequences[:, x.shape[1]:], tail) and torch.equal(res.accept_counts, counts)
    # loaded with trust_remote_code, MARS is the model's generate; the defaults come from generation_config.json
    mars = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True)
    s = Puts()
    one = mars.generate(input_ids=x[:1], attention_mask=mask[:1], max_new_tokens=NEW, streamer=s)
    tail, counts = expected(model, tok, PROMPTS[:1], DecodeConfig(tau=0.95, max_new_tokens=NEW))
    assert torch.equal(one[:, x.shape[1]:], tail[:, : one.shape[1] - x.shape[1]])
    assert len(s.puts) == 1 + len(counts) and sum(s.puts[1:], []) == one[0, x.shape[1]:].tolist()
    with pytest.raises(ValueError, match="unknown mode 'fastest'; allowed: "):
        plain.generate(input_ids=x, attention_mask=mask, custom_generate=str(out), trust_remote_code=True,
                       max_new_tokens=4, mode="fastest")


def test_exported_folder_is_lossless(exported, ref):
    plain = AutoModelForCausalLM.from_pretrained(str(exported[0]))
    assert_lossless_through_folder(plain, ref[1], exported[0])


def test_the_cli_then_a_fresh_process_with_only_transformers_runs_it(ref, tmp_path):
    """The bar as written: `python -m mars_core.export assets/models/tiny-mars-b4 OUT` as a
    subprocess, then an isolated Python (-I, mars_core not importable) runs MARS from OUT."""
    model, tok = ref
    out = tmp_path / "OUT"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    cli = subprocess.run([sys.executable, "-m", "mars_core.export", "assets/models/tiny-mars-b4", str(out)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert (out / "custom_generate" / "generate.py").is_file() and (out / "model.safetensors").is_file()
    script = tmp_path / "use.py"
    script.write_text(
        "import importlib.util, json, sys\n"
        "assert importlib.util.find_spec('mars_core') is None, 'mars_core must not be importable here'\n"
        "from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast\n"
        "out = sys.argv[1]\n"
        "tok, model = PreTrainedTokenizerFast.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out)\n"
        "inputs = tok.apply_chat_template([{'role': 'user', 'content': sys.argv[2]}], add_generation_prompt=True,"
        " return_tensors='pt', return_dict=True)\n"
        f"o = model.generate(**inputs, custom_generate=out, trust_remote_code=True, max_new_tokens={NEW},"
        " return_dict_in_generate=True)\n"
        "print(json.dumps({'tokens': o.sequences[0, inputs['input_ids'].shape[1]:].tolist(),"
        " 'accept_counts': o.accept_counts[:, 0].tolist(), 'modules': sorted(sys.modules)}))\n")
    run = subprocess.run([sys.executable, "-I", str(script), str(out), PROMPTS[1]], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    tail, counts = expected(model, tok, PROMPTS[1:2], DecodeConfig(tau=0.95, max_new_tokens=NEW))
    assert got["tokens"] == tail[0].tolist()
    assert got["accept_counts"] == counts[:, 0].tolist() and max(got["accept_counts"]) > 1  # MARS, not AR
    assert not [m for m in got["modules"] if m.split(".")[0] in ("mars_core", "tasks", "training", "playground")]


def save_a2d(folder: pathlib.Path, tokenizer, vocab_size=None, tie_config=True):
    """A checkpoint laid out like the released ones: model_type a2d-qwen2, the authors' class
    names and auto_map, and (as converted checkpoints do) a head of its own although the
    config says the embeddings are tied."""
    model = make_model("qwen2", vocab_size or len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="a2d-qwen2", architectures=["A2DQwen2LMHeadModel"], tie_word_embeddings=tie_config,
               auto_map={"AutoModelForCausalLM": "modeling_a2d.A2DQwen2LMHeadModel"})
    (folder / "config.json").write_text(json.dumps(cfg))
    return model


def test_export_of_a_released_style_checkpoint(tmp_path, tokenizer):
    src, out = tmp_path / "src", tmp_path / "out"
    original = save_a2d(src, tokenizer)
    summary = export(src, out, block_size=2, tau=0.8)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2" and "auto_map" not in config
    assert config["tie_word_embeddings"] is False  # the file's own head is what the model is
    assert any("a2d-qwen2" in n for n in summary["notes"])
    loaded = AutoModelForCausalLM.from_pretrained(str(out))  # no remote code
    assert type(loaded).__name__ == "Qwen2ForCausalLM"
    for (k, a), b in zip(original.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    ref_model, ref_tok = load_model(str(src), device="cpu")
    x, mask = batch(ref_tok, PROMPTS[:2])
    got = loaded.generate(input_ids=x, attention_mask=mask, custom_generate=str(out), trust_remote_code=True,
                          max_new_tokens=12)
    tail, _ = expected(ref_model, ref_tok, PROMPTS[:2], DecodeConfig(tau=0.8, block_size=2, max_new_tokens=12))
    assert torch.equal(got[:, x.shape[1]:], tail)


def _bare_tokenizer():
    """The test tokenizer without <|mask|> in its vocabulary."""
    from tokenizers import Tokenizer
    raw = json.loads(make_tokenizer().backend_tokenizer.to_str())
    raw["added_tokens"] = [t for t in raw["added_tokens"] if t["content"] != "<|mask|>"]
    vocab = raw["model"]["vocab"]
    vocab.pop("<|mask|>")
    for i, k in enumerate(sorted(vocab, key=vocab.get)):
        vocab[k] = i
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(raw)), eos_token="<|end|>",
                                   pad_token="<|pad|>")


def test_a_mask_token_is_added_only_into_a_free_embedding_row(tmp_path):
    bare = _bare_tokenizer()
    save_a2d(tmp_path / "full", bare)
    with pytest.raises(ValueError, match="no <\\|mask\\|> and the embedding matrix has no free row"):
        export(tmp_path / "full", tmp_path / "o1")
    assert not (tmp_path / "o1").exists()
    save_a2d(tmp_path / "room", bare, vocab_size=len(bare) + 8)
    summary = export(tmp_path / "room", tmp_path / "o2")
    assert summary["mask_token_id"] == len(bare) and any("not trained on" in n for n in summary["notes"])


def test_the_mask_never_lands_on_the_unknown_token(tmp_path):
    """A tokenizer with an unknown token maps "<|mask|>" to it: the export must add a token of its
    own (in a free row) instead, and refuse when there is no free row."""
    bare = _bare_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=bare.backend_tokenizer, eos_token="<|end|>",
                                  pad_token="<|pad|>", unk_token="<|user|>")
    assert tok.convert_tokens_to_ids("<|mask|>") == tok.unk_token_id
    save_a2d(tmp_path / "room", tok, vocab_size=len(tok) + 8)
    try:
        summary = export(tmp_path / "room", tmp_path / "o1")
    except ValueError as e:
        pytest.fail(f"a free embedding row was there for a mask token of its own: {e}")
    assert summary["mask_token_id"] == len(tok) != tok.unk_token_id
    saved = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "o1"))
    assert saved.mask_token_id == len(tok) and saved.convert_ids_to_tokens(len(tok)) == "<|mask|>"
    save_a2d(tmp_path / "full", tok)
    with pytest.raises(ValueError, match="no free row"):
        export(tmp_path / "full", tmp_path / "o2")


def test_a_mask_token_outside_the_embeddings_is_refused(tmp_path):
    """A tokenizer whose mask token has an id the model has no embedding row for."""
    tok = PreTrainedTokenizerFast(tokenizer_object=_bare_tokenizer().backend_tokenizer, eos_token="<|end|>",
                                  pad_token="<|pad|>", mask_token="<|mask|>")
    assert tok.mask_token_id == len(tok) - 1
    save_a2d(tmp_path / "src", tok, vocab_size=len(tok) - 1)
    with pytest.raises(ValueError, match="outside the embedding matrix"):
        export(tmp_path / "src", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_export_refuses_what_would_not_load(tmp_path, tokenizer):
    (tmp_path / "t5").mkdir()
    (tmp_path / "t5" / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8}))
    with pytest.raises(ValueError, match="not a causal language model: model_type 't5'"):
        export(tmp_path / "t5", tmp_path / "o")
    with pytest.raises(ValueError, match="is not a model folder: it has no config.json"):
        export(tmp_path, tmp_path / "o")
    src = tmp_path / "src"
    save_a2d(src, tokenizer)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=96)))
    with pytest.raises(ValueError, match="the weights do not fit a stock Qwen2ForCausalLM"):
        export(src, tmp_path / "o")
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    with pytest.raises(ValueError, match="has no .safetensors weights .found \\['pytorch_model.bin'\\]"):
        export(src, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_cli(tmp_path, capsys, tokenizer):
    assert main([str(tmp_path / "missing"), str(tmp_path / "o")]) == 2
    assert "error: " in capsys.readouterr().err
    save_a2d(tmp_path / "src", tokenizer)
    assert main([str(tmp_path / "src"), str(tmp_path / "o")]) == 0
    assert main([str(tmp_path / "src"), str(tmp_path / "o")]) == 2  # OUT exists
    assert "--overwrite" in capsys.readouterr().err
    assert main([str(tmp_path / "src"), str(tmp_path / "o"), "--overwrite", "--block-size", "3"]) == 0
    assert GenerationConfig.from_pretrained(str(tmp_path / "o")).mars["block_size"] == 3
    assert main(["--method-only", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "custom_generate" / "generate.py").is_file()
