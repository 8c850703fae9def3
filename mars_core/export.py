"""`python -m mars_core.export SRC OUT`: a MARS checkpoint as a Hub-ready model folder.

OUT loads with plain `AutoModelForCausalLM.from_pretrained(OUT)` (no remote code) and decodes
with MARS through `model.generate(**inputs, custom_generate=OUT, trust_remote_code=True)`:

- config.json: a model type only remote code knows (the released `a2d-qwen2`) becomes the stock
  one (`qwen2`), `auto_map` is dropped; the weights must fit the stock class (checked on the
  meta device). A tied head that the checkpoint ships with values of its own is untied, which is
  what transformers does anyway on load, and what vLLM / SGLang need to read it right.
- *.safetensors: copied byte for byte (sha256 in the card). No safetensors: refused.
- tokenizer: with `<|mask|>` as its mask token (added only when an embedding row is free).
- generation_config.json: the source's, plus `mars`: the decoding defaults and the mask id;
  config.json also names the mask id `pard_token`, so the folder serves as a vLLM parallel
  drafter as it is (docs/serving.md).
- custom_generate/: generated from mars_core (`export_method`); README.md: the model card.

`python -m mars_core.export --method-only OUT` writes only custom_generate/ (a Hub repository
that holds the decoding method for any MARS checkpoint). The folder is built next to OUT and
renamed into place, so OUT is never half written.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import torch

from . import packaged
from .export_card import method_card, model_card
from .export_method import write_method
from .gate import GATE_FILE
from .loading import ALIASES, load_tokenizer, trained_block_size
from .prompts import MASK_TOKEN

WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")
KEEP_FILES = ("eval.json", "training_config.json", "LICENSE", "LICENSE.txt", "NOTICE")
PROBES = ("What is 12 + 30? Answer: 42.", "  Tabs\tand\nnew lines\n\n", "Ünïcödé, 漢字, emoji 🙂 (x) [y] {z}",
          "it's THEY'RE we'll 1234567 3.14 -5e3", MASK_TOKEN)


def export(src: str | os.PathLike, out: str | os.PathLike, *, block_size: int | None = None, tau: float = 0.95,
           overwrite: bool = False, repo_id: str | None = None) -> dict:
    """Write the Hub-ready folder for the checkpoint folder `src` to `out`; returns a summary
    (the notes say what was rewritten). `repo_id` (default: OUT's name) is what the card's usage
    loads. Raises ValueError on anything that would not load."""
    if packaged.is_named(str(src)) and not Path(src).exists():
        src = packaged.ensure_named(str(src))  # a named real model: its cached folder, made on first use
    src, out = Path(src).expanduser().resolve(), Path(out).expanduser().resolve()
    if not (src / "config.json").is_file():
        raise ValueError(f"{src} is not a model folder: it has no config.json")
    if out == src or src in out.parents:
        raise ValueError("OUT must be a new folder outside SRC")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out} exists and is not empty; pass --overwrite to replace it")
    notes: list[str] = []
    raw = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config_json, config = _stock_config(raw, notes)
    weights = _weight_files(src)
    if _head_needs_untying(src, weights, config):
        config_json["tie_word_embeddings"] = False
        notes.append("tie_word_embeddings set to false: the checkpoint ships an output head of its own")
    B, block_note = _block_size(src, block_size)
    notes += block_note
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        (tmp / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
        hashes = {f: _copy_hashed(src / f, tmp / f) for f in weights}
        if (src / WEIGHTS_INDEX).is_file():
            shutil.copyfile(src / WEIGHTS_INDEX, tmp / WEIGHTS_INDEX)
        mask_id, tokenizer_class = _export_tokenizer(src, tmp, config, notes)
        config_json["pard_token"] = mask_id  # vLLM's parallel drafting reads the mask id here
        (tmp / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
        mars = {"mode": "mars", "tau": float(tau), "block_size": B, "mask_token_id": mask_id}
        if (src / GATE_FILE).is_file():  # a mask-gated fine-tune: the weights are the base's
            hashes[GATE_FILE] = _copy_hashed(src / GATE_FILE, tmp / GATE_FILE)
            mars["gated"] = True
            mars["repeat_guard"] = True  # tau's default for our gated models (DecodeConfig.repeat_guard)
            notes.append(f"mask-gated: {GATE_FILE} holds the adapters that act at mask positions only; a stock "
                         "load gives the base model (the same AR output), custom_generate attaches the gate")
        _write_generation_config(src, tmp, config_json, mars)
        for name in KEEP_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, tmp / name)
        write_method(tmp)
        eval_json = json.loads((src / "eval.json").read_text(encoding="utf-8")) if (src / "eval.json").is_file() else None
        card_src = (src / "README.md").read_text(encoding="utf-8") if (src / "README.md").is_file() else None
        (tmp / "README.md").write_text(model_card(repo_id or out.name, config_json, mars, tokenizer_class, hashes, notes,
                                                  eval_json, card_src), encoding="utf-8")
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(out), "model_type": config_json["model_type"], "mask_token_id": mask_id, "block_size": B,
            "tokenizer_class": tokenizer_class, "weights": hashes, "notes": notes}


def _stock_config(raw: dict, notes: list[str]):
    """The config as a stock causal LM: (json dict, config object). ValueError if it is none."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    raw = dict(raw)
    model_type = raw.get("model_type")
    if model_type in ALIASES:
        stock = ALIASES[model_type].model_type
        notes.append(f"model_type {model_type!r} rewritten to the stock {stock!r} (same weights layout)")
        raw["model_type"] = model_type = stock
        raw["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[stock]]
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"not a causal language model: model_type {model_type!r} has no stock "
                         f"AutoModelForCausalLM class (MARS needs a decoder-only causal LM, e.g. qwen2, llama)")
    if raw.pop("auto_map", None) is not None:
        notes.append("auto_map dropped: the folder runs no remote modeling code")
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    if raw.get("architectures") not in (None, [arch]):
        notes.append(f"architectures {raw['architectures']} rewritten to [{arch!r}]")
        raw["architectures"] = [arch]
    config = AutoConfig.for_model(**raw)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"not a causal language model: {model_type!r} is an encoder-decoder")
    return raw, config


def _weight_files(src: Path) -> list[str]:
    files = sorted(p.name for p in src.glob("*.safetensors") if p.name != GATE_FILE)
    if not files:
        found = sorted(p.name for p in src.glob("*.bin")) + sorted(p.name for p in src.glob("*.pt*"))
        raise ValueError(f"{src} has no .safetensors weights" + (f" (found {found}; convert them to safetensors "
                                                                  "first, pickled weights are never loaded)" if found else ""))
    return files


def _head_needs_untying(src: Path, weights: list[str], config) -> bool:
    """Check that the checkpoint fits the stock class (names and shapes, on the meta device);
    True when the config ties the head but the checkpoint's head differs from the embeddings."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = model.get_expanded_tied_weights_keys() if hasattr(model, "get_expanded_tied_weights_keys") else {}
    shapes, where = {}, {}
    for name in weights:
        with safe_open(str(src / name), "pt") as f:
            for key in f.keys():
                shapes[key], where[key] = tuple(f.get_slice(key).get_shape()), name
    unexpected = sorted(set(shapes) - set(expected))
    missing = sorted(set(expected) - set(shapes) - set(tied))
    wrong = sorted(k for k in set(shapes) & set(expected) if shapes[k] != expected[k])
    if unexpected or missing or wrong:
        raise ValueError(f"the weights do not fit a stock {type(model).__name__}: unexpected {unexpected[:5]}, "
                         f"missing {missing[:5]}, wrong shape {wrong[:5]}")
    for target, source in tied.items():
        if target in shapes and source in shapes:
            with safe_open(str(src / where[target]), "pt") as a, safe_open(str(src / where[source]), "pt") as b:
                if not torch.equal(a.get_tensor(target), b.get_tensor(source)):
                    return True
    return False


def _block_size(src: Path, block_size: int | None) -> tuple[int, list[str]]:
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        return block_size, []
    trained = trained_block_size(str(src))
    if trained is not None:
        return trained, []
    return 4, ["block size 4 by default (the source records none; pass --block-size to set it)"]


def _export_tokenizer(src: Path, tmp: Path, config, notes: list[str]) -> tuple[int, str]:
    """Save the tokenizer with <|mask|> as its mask token; returns (mask id, the class to load it with)."""
    from transformers import AutoTokenizer

    tok = load_tokenizer(str(src))
    rows = config.vocab_size
    mask_id = tok.convert_tokens_to_ids(MASK_TOKEN)
    if tok.mask_token is not None and tok.mask_token != MASK_TOKEN:
        notes.append(f"mask token {tok.mask_token!r} kept (not {MASK_TOKEN})")
        mask_id = tok.mask_token_id
    elif mask_id is None or mask_id == tok.unk_token_id:
        if len(tok) >= rows:
            raise ValueError(f"the tokenizer has no {MASK_TOKEN} and the embedding matrix has no free row for one "
                             f"({len(tok)} tokens, {rows} rows); MARS needs a model trained with a mask token")
        tok.add_special_tokens({"mask_token": MASK_TOKEN})
        mask_id = tok.mask_token_id
        notes.append(f"{MASK_TOKEN} added at id {mask_id}, an embedding row the model was not trained on: "
                     "MARS decoding needs a model fine-tuned with that mask")
    else:
        tok.mask_token = MASK_TOKEN
    if mask_id >= rows:
        raise ValueError(f"the mask token id {mask_id} is outside the embedding matrix ({rows} rows)")
    if mask_id == tok.unk_token_id or tok.convert_ids_to_tokens(mask_id) != tok.mask_token:
        # the id would also stand for text (the unknown token, or another token's id)
        raise ValueError(f"the mask token {tok.mask_token!r} has no id of its own (id {mask_id} is "
                         f"{tok.convert_ids_to_tokens(mask_id)!r}); give the tokenizer a mask token in its vocabulary")
    tok.save_pretrained(str(tmp))
    for name in TOKENIZER_FILES:  # files the tokenizer class does not rewrite (e.g. a chat template json)
        if (src / name).is_file() and not (tmp / name).exists():
            shutil.copyfile(src / name, tmp / name)
    auto = AutoTokenizer.from_pretrained(str(tmp))
    if _same_tokenizer(auto, tok):
        return mask_id, "AutoTokenizer"
    notes.append(f"AutoTokenizer loads this folder as a {type(auto).__name__}, which does not reproduce the "
                 "tokenizer (its length or encodings differ): load it with PreTrainedTokenizerFast")
    return mask_id, "PreTrainedTokenizerFast"


def _same_tokenizer(a, b) -> bool:
    if len(a) != len(b) or a.mask_token_id != b.mask_token_id or a.eos_token_id != b.eos_token_id:
        return False
    return all(a(p, add_special_tokens=False)["input_ids"] == b(p, add_special_tokens=False)["input_ids"] for p in PROBES)


def _write_generation_config(src: Path, tmp: Path, config_json: dict, mars: dict) -> None:
    path = src / "generation_config.json"
    gen = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if gen.get(key) is None and config_json.get(key) is not None:
            gen[key] = config_json[key]
    gen.pop("_from_model_config", None)  # with it set, transformers drops every entry it does not know
    gen["mars"] = mars
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")


def _copy_hashed(a: Path, b: Path) -> str:
    shutil.copyfile(a, b)
    h = hashlib.sha256()
    with open(b, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _replace(tmp: Path, out: Path) -> None:
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mars_core.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="?", help="checkpoint folder (config.json, *.safetensors, tokenizer), or a name of "
                                           "mars_core.packaged (e.g. smollm2-135m-mars)")
    ap.add_argument("out", help="the folder to write")
    ap.add_argument("--block-size", type=int, default=None, help="MARS block size (default: the training record's, else 4)")
    ap.add_argument("--tau", type=float, default=0.95, help="default acceptance threshold (0.95)")
    ap.add_argument("--repo-id", default=None, help="the Hub id the card's usage names (default: OUT's name)")
    ap.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    ap.add_argument("--method-only", action="store_true", help="write only OUT/custom_generate/ (no SRC)")
    args = ap.parse_args(argv)
    try:
        if args.method_only:
            files = write_method(args.out)
            (Path(args.out) / "README.md").write_text(method_card(), encoding="utf-8")
            print(f"wrote README.md and {len(files)} files under {Path(args.out) / 'custom_generate'}")
            return 0
        if args.src is None:
            ap.error("SRC is required (or --method-only)")
        from .config import check_tau

        summary = export(args.src, args.out, block_size=args.block_size, tau=check_tau(args.tau, "probability"),
                         overwrite=args.overwrite, repo_id=args.repo_id)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {summary['out']} ({summary['model_type']}, mask id {summary['mask_token_id']}, "
          f"block size {summary['block_size']}, tokenizer via {summary['tokenizer_class']})")
    for note in summary["notes"]:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
