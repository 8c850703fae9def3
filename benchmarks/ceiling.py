"""Will it pay on my hardware? The cost of a forward with k new tokens against one, per batch size.

    python -m benchmarks.ceiling                                   # the bundled MARS model
    python -m benchmarks.ceiling --shape qwen2.5-0.5b --dtype bfloat16
    python -m benchmarks.ceiling --config path/to/config.json     # any shape, random weights
    python -m benchmarks.ceiling --model Qwen/Qwen2.5-0.5B-Instruct --new-tokens 1,4,8,16

Every multi-token method (MARS, lossless MARS, speculative decoding, prompt lookup) trades
more tokens per forward for wider forwards. A method that emits T tokens per forward with
forwards of k new tokens is at most T x c(1) / c(k) times as fast as AR, where c(k) is the cost
of one forward of k new tokens over a cached context (everything outside the forward, and a
draft model's forwards, only lower it). This command measures c(k) / c(1) on your machine for
each batch size, before you train anything, and prints that ceiling for the tokens per forward
you pass.

Weights do not change the cost, so `--shape` and `--config` build a random model from a config
(no download, nothing saved); `--model` loads a real one. Each forward writes its k tokens after
`--context` cached tokens into a `CursorCache` (the same slots every time, as the cursor decoders
do), with a 4-D causal mask. Timing: after a warm-up, the k values are interleaved and rotated
within each repetition; the median is reported. Hold `flock /tmp/cpu-bench.lock` for figures
you publish.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from mars_core.lists import list_arg
from mars_core.loading import DTYPES
from mars_core.prompts import context_limit

DEFAULT_MODEL = "assets/models/tiny-mars-b4"
# published configs (model cards / config.json of each family), no weights needed
SHAPES = {
    "bundled": dict(model_type="qwen2", hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
}


def build_model(args):
    """(model, name): a loaded model, or a random one of the given shape."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    if args.model:
        from mars_core.loading import load_model

        model, _ = load_model(args.model, device=args.device, dtype=dtype)
        return model, args.model
    if args.config:
        try:
            with open(args.config, encoding="utf-8") as f:
                spec = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read --config {args.config!r}: {e}") from None
        name = os.path.basename(args.config)
    else:
        spec, name = dict(SHAPES[args.shape]), f"{args.shape} shape (random weights)"
    spec = dict(spec)
    kind = spec.pop("model_type", None)
    if kind is None:
        raise ValueError("the config has no model_type (e.g. \"qwen2\", \"llama\")")
    try:
        config = AutoConfig.for_model(kind, **spec)
    except (ValueError, KeyError) as e:
        raise ValueError(f"cannot build a {kind!r} config: {e}") from None
    config._attn_implementation = "sdpa"
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval(), name


@torch.no_grad()
def forward_costs(model, batch: int, context: int, ks: list[int], repeats: int, warmup: int = 2) -> dict[int, float]:
    """Median seconds of one forward of k new tokens after `context` cached ones, per k."""
    from mars_core.decode_cursor import CursorCache

    dev = next(model.parameters()).device
    V = model.config.vocab_size
    cache = CursorCache(batch, context + max(ks))
    g = torch.Generator().manual_seed(0)
    ctx_ids = torch.randint(0, V, (batch, context), generator=g).to(dev)

    def step(start: int, ids: torch.Tensor):
        W = ids.shape[1]
        pos = (start + torch.arange(W, device=dev))[None].expand(batch, W)
        L = start + W
        visible = torch.arange(L, device=dev)[None, None, :] <= pos[:, :, None]
        cache.plan([start] * batch, pos, L)
        model(input_ids=ids, attention_mask=visible[:, None], position_ids=pos, cache=cache, use_cache=True,
              logits_to_keep=W)

    step(0, ctx_ids)  # fill the context once
    new = {k: torch.randint(0, V, (batch, k), generator=g).to(dev) for k in ks}
    times: dict[int, list[float]] = {k: [] for k in ks}
    for rep in range(warmup + repeats):
        order = ks[rep % len(ks):] + ks[: rep % len(ks)]
        for k in order:
            t0 = time.perf_counter()
            step(context, new[k])
            if rep >= warmup:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def report(name: str, args, costs: dict[int, dict[int, float]]) -> str:
    ks = args.new_tokens
    lines = [f"## Forward cost on this machine: {name}, {args.dtype}, {args.context} cached tokens", "",
             "Cost of one forward of k new tokens relative to one new token (c(k) / c(1)):", "",
             "| batch | c(1), ms | " + " | ".join(f"k = {k}" for k in ks) + " |",
             "|---:|---:|" + "---:|" * len(ks)]
    for b, c in costs.items():
        lines.append(f"| {b} | {c[1] * 1e3:.2f} | " + " | ".join(f"{c[k] / c[1]:.2f}x" for k in ks) + " |")
    for T in args.tokens_per_forward:
        lines += ["", f"Speed-up ceiling over AR at {T:g} tokens per forward, T x c(1) / c(k):", "",
                  "| batch | " + " | ".join(f"k = {k}" for k in ks) + " |", "|---:|" + "---:|" * len(ks)]
        for b, c in costs.items():
            lines.append(f"| {b} | " + " | ".join(f"{T * c[1] / c[k]:.2f}x" for k in ks) + " |")
    lines += ["", "k is the width of one forward: MARS with block B forwards its accepted tokens plus B - 1 masks "
              "(k ~ T + B - 1); lossless MARS its new tokens (1 to B) + B - 1 drafts + B - 1 masks with the "
              "default draft_groups='last' (k = 7 to 10 at B = 4), or B groups of B - 1 masks with 'all' "
              "(k = 16 at B = 4); speculative decoding K drafts + 1 (+ B - 1 masks with a MARS target and 'last'), "
              "plus the draft's cost.",
              f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
              f"{args.repeats} repetitions, median."]
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.ceiling", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="a model folder or hub id (loads its weights)")
    src.add_argument("--shape", choices=sorted(SHAPES), help="a known shape with random weights")
    src.add_argument("--config", help="a config.json (with model_type) of any shape, random weights")
    p.add_argument("--batch-sizes", type=list_arg(int, minimum=1), default=(1, 4, 8, 16))
    p.add_argument("--new-tokens", type=list_arg(int, minimum=1), default=(1, 2, 4, 8, 16), help="k values (1 is always added)")
    p.add_argument("--context", type=int, default=200, help="cached tokens before the new ones")
    p.add_argument("--tokens-per-forward", type=list_arg(float, minimum=1), default=(2.5, 3.5),
                   help="tokens per forward to price (at least 1: every forward emits a token)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--prepack", action="store_true",
                   help="linear layers on oneDNN's prepacked matmul (CPU; mars_core.cpu.prepack)")
    p.add_argument("--output", help="also write ceiling.md and ceiling.json here")
    args = p.parse_args(argv)
    if not (args.model or args.config or args.shape):
        args.model = DEFAULT_MODEL if os.path.isdir(DEFAULT_MODEL) else None
        args.shape = None if args.model else "bundled"
    if args.context < 1 or args.repeats < 1 or args.threads < 1:
        p.error("--context, --repeats and --threads must be >= 1")
    args.new_tokens = sorted({1, *args.new_tokens})
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        model, name = build_model(args)
        if args.prepack:
            from mars_core.cpu import prepack

            _, note = prepack(model)
            if note:
                raise ValueError(f"--prepack: {note}")
            name += ", linear layers prepacked for oneDNN"
        limit = context_limit(model)
        if limit is not None and args.context + max(args.new_tokens) > limit:
            raise ValueError(f"--context {args.context} + {max(args.new_tokens)} new tokens exceeds the model's {limit} positions")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    costs = {}
    for b in args.batch_sizes:
        print(f"[ceiling] batch {b}", file=sys.stderr, flush=True)
        costs[b] = forward_costs(model, b, args.context, args.new_tokens, args.repeats)
    text = report(name, args, costs)
    print(text)
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        with open(os.path.join(args.output, "ceiling.md"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        record = {"model": name, "settings": {k: v for k, v in vars(args).items()},
                  "seconds": {str(b): {str(k): s for k, s in c.items()} for b, c in costs.items()},
                  "torch": torch.__version__, "threads": torch.get_num_threads()}
        with open(os.path.join(args.output, "ceiling.json"), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
