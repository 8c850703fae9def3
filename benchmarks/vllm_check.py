"""Run the vLLM recipes of docs/serving.md on a GPU machine and compare greedy outputs with mars_core.

    pip install vllm                      # on the GPU machine; not in requirements.txt
    python -m benchmarks.vllm_check --model assets/models/tiny-mars-b4 --out runs/vllm_check.json
    python -m benchmarks.vllm_check --model Xalphinions/MARS-Qwen2.5-0.5B-blk4 \
        --target Xalphinions/MARS-Qwen2.5-0.5B-AR-SFT --prompts 64

Two checks, same prompts (held-out synthetic problems, or --prompt-file, one per line), the
same token ids fed to both engines (vLLM gets `TokensPrompt`s, so tokenizer classes cannot
differ), greedy, fp32 by default so that kernel differences rarely flip an argmax:

1. AR: `vllm serve`-equivalent `LLM(model=OUT)` on the exported folder (config rewritten to
   qwen2 by `mars_core.export`) must reproduce mars_core's AR decoding of the same weights.
2. Parallel drafting: `LLM(model=TARGET, speculative_config={"method": "draft_model",
   "model": OUT, "num_speculative_tokens": B, "parallel_drafting": True})` must reproduce
   mars_core's AR decoding of TARGET (speculative decoding is lossless), and vLLM's acceptance
   counters say how many drafts the MARS model got accepted. TARGET defaults to the MARS model
   itself (it then drafts for itself).

Reports, per check, the share of prompts equal token for token and the first position where the
others differ; exit status 1 when a check is below --min-equal (default 1.0).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

from mars_core import DecodeConfig, generate, load_model
from mars_core.export import export
from mars_core.loading import DTYPES
from mars_core.prompts import encode_prompt


def compare(expected: list[list[int]], got: list[list[int]], stop_ids: set[int]) -> dict:
    """Share of rows equal token for token (a trailing stop id on `got` is ignored, mars_core
    leaves it out), and for the others the first differing position."""
    diffs = []
    for i, (a, b) in enumerate(zip(expected, got)):
        b = b[:-1] if b and b[-1] in stop_ids and len(b) == len(a) + 1 else b
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diffs.append({"prompt": i, "first_difference": at, "expected": a[at:at + 5], "got": b[at:at + 5]})
    n = max(len(expected), 1)
    return {"equal": (len(expected) - len(diffs)) / n, "n": len(expected), "differences": diffs[:10]}


def prompts_from(args, tokenizer) -> list[list[int]]:
    if args.prompt_file:
        with open(args.prompt_file, encoding="utf-8") as f:
            texts = [line.strip() for line in f if line.strip()]
    else:
        from tasks.synthetic import make_examples  # floor 1, allowed here

        texts = [ex["messages"][0]["content"] for ex in make_examples(args.prompts, 0, "eval")]
    return [encode_prompt(tokenizer, t) for t in texts[: args.prompts]]


def mars_core_ar(source: str, prompt_ids: list[list[int]], max_new: int, dtype) -> tuple[list[list[int]], set[int]]:
    """Greedy AR outputs of `source` by mars_core (the reference), and its stop ids."""
    from mars_core.generate import decode_steps

    model, tok = load_model(source, dtype=dtype)
    rows, steps = decode_steps(model, tok, prompt_ids, DecodeConfig(mode="ar", max_new_tokens=max_new))
    for _ in steps:
        pass
    stops = {int(s) for s in rows.stop_ids.tolist()}
    del model
    return rows.out, stops


def vllm_outputs(llm, prompt_ids, max_new: int) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_new)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params)
    return [list(o.outputs[0].token_ids) for o in outs]


def acceptance(llm) -> dict:
    """vLLM's speculative-decoding counters, where this vLLM version exposes them."""
    try:
        metrics = {m.name: getattr(m, "value", getattr(m, "values", None)) for m in llm.get_metrics()}
    except Exception as e:  # noqa: BLE001 - counters moved between versions; the check does not need them
        return {"unavailable": f"{type(e).__name__}: {e}"}
    return {k: v for k, v in metrics.items() if "spec_decode" in k}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.vllm_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="MARS checkpoint: folder or hub id (a2d-qwen2 is exported first)")
    ap.add_argument("--target", default=None, help="target for parallel drafting (default: --model)")
    ap.add_argument("--block-size", type=int, default=None, help="drafts per step (default: the export's block size)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-file", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    # the names both engines take (load_model and LLM); not "auto", which each resolves its own way
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--min-equal", type=float, default=1.0)
    ap.add_argument("--out", default=None, help="write the report as JSON here too")
    args = ap.parse_args(argv)
    try:
        import vllm
    except ImportError:
        print("error: vllm is not installed; this check runs on a GPU machine after `pip install vllm`",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: no CUDA device; vLLM needs a GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    work = tempfile.mkdtemp(prefix="mars-vllm-")
    summary = export(args.model if os.path.isdir(args.model) else _download(args.model),
                     os.path.join(work, "mars"), block_size=args.block_size)
    out_dir, B = summary["out"], summary["block_size"]
    target = args.target or out_dir
    _, tok = load_model(out_dir, device="cpu")
    prompt_ids = prompts_from(args, tok)
    report = {"vllm": vllm.__version__, "model": args.model, "target": args.target or args.model,
              "block_size": B, "dtype": args.dtype, "max_new_tokens": args.max_new_tokens}
    from vllm import LLM

    expected, stops = mars_core_ar(out_dir, prompt_ids, args.max_new_tokens, dtype)
    llm = LLM(model=out_dir, dtype=args.dtype, seed=0)
    report["ar"] = compare(expected, vllm_outputs(llm, prompt_ids, args.max_new_tokens), stops)
    del llm
    expected_t, stops_t = (expected, stops) if target == out_dir else mars_core_ar(
        target, prompt_ids, args.max_new_tokens, dtype)
    spec = {"method": "draft_model", "model": out_dir, "num_speculative_tokens": B, "parallel_drafting": True}
    llm = LLM(model=target, dtype=args.dtype, seed=0, speculative_config=spec)
    report["parallel_drafting"] = compare(expected_t, vllm_outputs(llm, prompt_ids, args.max_new_tokens), stops_t)
    report["parallel_drafting"]["speculative_config"] = spec
    report["parallel_drafting"]["acceptance"] = acceptance(llm)
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    worst = min(report["ar"]["equal"], report["parallel_drafting"]["equal"])
    return 0 if worst >= args.min_equal else 1


def _download(repo_id: str) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"])


if __name__ == "__main__":
    sys.exit(main())
