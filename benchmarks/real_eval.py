"""Tokens per forward of a real chat model on public prompt sets, the way Spec-Bench reports it.

For each setting (AR, MARS at each tau, lossless MARS) every prompt is decoded greedily and its
generated ids, tokens and forwards are written, one JSON line per (setting, prompt), to
`OUT/outputs.jsonl`; a rerun skips what is there, so a long sweep resumes. The summary gives,
per category and overall: mean accepted tokens per forward (tokens / forwards, 1.00 for AR; the
forward that emits EOS counts), the share of outputs identical to the same model's AR output,
and the mean position of the first difference among those that differ.

Prompt sets (read from a path; neither is committed, see docs/smollm2.md for where they come from):
- `--spec-bench FILE`: Spec-Bench's `data/spec_bench/question.jsonl` (first turn of each question);
- `--self-instruct FILE`: self-instruct's `human_eval/user_oriented_instructions.jsonl`
  (instruction, then the first instance's input);
- `--prompts FILE`: `{"id", "prompt"}` lines (our own: `training.chat_prompts`).

    python -m benchmarks.real_eval --model smollm2-135m-mars --spec-bench question.jsonl --out runs/specbench
"""
from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections import defaultdict

import torch

from mars_core import DecodeConfig, load_model
from mars_core.gate import install_gate
from mars_core.generate import decode_steps
from mars_core.prompts import encode_prompt
from mars_core.tree import parse_trees


def read_set(kind: str, path: str, limit: int | None = None, per_category: int | None = None) -> list[dict]:
    """`{"id", "category", "prompt"}` records of one of the three formats: the first `limit`, or the
    first `per_category` of each category (a Spec-Bench sweep in stages, every category in each)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                if kind == "spec-bench":
                    rows.append({"id": r["question_id"], "category": r["category"], "prompt": r["turns"][0],
                                 **gsm8k_answer(r.get("reference"))})
                elif kind == "self-instruct":
                    inp = (r.get("instances") or [{}])[0].get("input", "").strip()
                    rows.append({"id": r["id"], "category": "self-instruct",
                                 "prompt": r["instruction"] + ("\n\n" + inp if inp else "")})
                else:
                    rows.append({"id": r["id"], "category": r.get("category", "ours"), "prompt": r["prompt"],
                                 "answers": r.get("answers"), "rule": r.get("rule", "contains")})
            except (ValueError, KeyError, TypeError, IndexError) as e:
                raise ValueError(f"{path}:{number}: not a {kind} record ({type(e).__name__}: {e})") from None
    return first_of_each(rows, per_category)[:limit]


def first_of_each(records: list[dict], n: int | None) -> list[dict]:
    """The first `n` records of each category, in their order (all of them where `n` is None)."""
    seen: dict[str, int] = defaultdict(int)
    kept = []
    for r in records:
        seen[r.get("category")] += 1
        if n is None or seen[r.get("category")] <= n:
            kept.append(r)
    return kept


def settings(taus: list[float], lossless: bool, block_size: int, ar: bool = True,
             draft_groups: str = "all", prompt_lookup: int = 0,
             prompt_lookup_tokens: int | None = None,
             draft_trees: tuple[tuple[int, ...], ...] = (), repeat_guard: bool = False,
             guard_only: bool = False) -> dict[str, DecodeConfig]:
    """AR, MARS at each tau (and with the repeat guard beside it where `repeat_guard`: "mars-0.9-guard";
    only with it where `guard_only`),
    lossless MARS (and with prompt-lookup drafts where `prompt_lookup`, with each draft tree of
    `draft_trees`: "lossless-tree2-2-1").
    Lossless carries a mask group after every possible accept count ("all"): on a real model
    most steps reject a draft, and "last" would then have no drafts for the next step
    (docs/lossless.md)."""
    out = {"ar": DecodeConfig(mode="ar", cache="cursor")} if ar else {}
    for tau in taus:
        if not guard_only:
            out[f"mars-{tau:g}"] = DecodeConfig(mode="mars", tau=tau, block_size=block_size, cache="cursor")
        if repeat_guard or guard_only:
            out[f"mars-{tau:g}-guard"] = DecodeConfig(mode="mars", tau=tau, block_size=block_size, cache="cursor",
                                                      repeat_guard=True)
    if lossless:  # a layout other than "all" is named: its tokens per forward differ
        out["lossless" + ("" if draft_groups == "all" else f"-{draft_groups}")] = DecodeConfig(
            mode="lossless", block_size=block_size, cache="cursor", draft_groups=draft_groups)
    if prompt_lookup:
        name = (f"lossless-lookup{prompt_lookup}" + (f"-L{prompt_lookup_tokens}" if prompt_lookup_tokens else "")
                + ("" if draft_groups == "all" else f"-{draft_groups}"))
        out[name] = DecodeConfig(mode="lossless", block_size=block_size, cache="cursor", draft_groups=draft_groups,
                                 prompt_lookup=prompt_lookup, prompt_lookup_tokens=prompt_lookup_tokens)
    for widths in draft_trees:
        name = "lossless-tree" + "-".join(map(str, widths))
        out[name] = DecodeConfig(mode="lossless", block_size=block_size, cache="cursor", draft_tree=widths)
        if prompt_lookup:  # and the tree where the text does not repeat, the lookup chain where it does
            out[f"{name}-lookup{prompt_lookup}" + (f"-L{prompt_lookup_tokens}" if prompt_lookup_tokens else "")] = \
                DecodeConfig(mode="lossless", block_size=block_size, cache="cursor", draft_tree=widths,
                             prompt_lookup=prompt_lookup, prompt_lookup_tokens=prompt_lookup_tokens)
    return out


def gsm8k_answer(reference) -> dict:
    """Spec-Bench's math_reasoning questions are GSM8K's, with the worked answer as `reference`
    ("... #### 1000"): its final number, scored by the last number of the output."""
    text = reference[0] if isinstance(reference, list) and reference else reference
    m = re.search(r"####\s*(-?[\d,]*\.?\d+)\s*$", text) if isinstance(text, str) else None
    return {"answers": [m.group(1).replace(",", "")], "rule": "last-number"} if m else {}


def is_correct(text: str, answers: list[str], rule: str = "contains") -> bool:
    """rule "contains": does `text` contain one of `answers`? A number must stand alone ("0" is not
    found in "10"); words are matched case-insensitively. rule "last-number": is the last number of
    `text` (commas dropped) equal to one of `answers` (GSM8K's scoring)?"""
    if rule == "last-number":
        numbers = re.findall(r"-?\d[\d,]*\.?\d*", text)
        if not numbers:
            return False
        last = numbers[-1].replace(",", "").rstrip(".")
        return any(float(last) == float(a) for a in answers)
    for a in answers:
        pattern = rf"(?<![\d.]){re.escape(a)}(?!\d)" if a.isdigit() else re.escape(a)
        if re.search(pattern, text, flags=re.IGNORECASE):
            return True
    return False


def run_setting(model, tokenizer, name: str, config: DecodeConfig, prompts: list[dict], out_path: str,
                batch_size: int, max_new_tokens: int, log=print) -> None:
    """Decode the prompts not yet in `out_path` for this setting; batches of similar length."""
    done = set()
    if os.path.isfile(out_path):
        with open(out_path, encoding="utf-8") as f:
            done = {(r["setting"], r["id"]) for r in map(json.loads, filter(str.strip, f))}
    todo = [p for p in prompts if (name, p["id"]) not in done]
    config = DecodeConfig(**{**config.__dict__, "max_new_tokens": max_new_tokens})
    encoded = sorted(((encode_prompt(tokenizer, p["prompt"]), p) for p in todo), key=lambda e: len(e[0]))
    start = time.time()
    for i in range(0, len(encoded), batch_size):
        chunk = encoded[i:i + batch_size]
        rows, steps = decode_steps(model, tokenizer, [e[0] for e in chunk], config)
        for _ in steps:
            pass
        with open(out_path, "a", encoding="utf-8") as f:
            for j, (ids, p) in enumerate(chunk):
                forwards = sum(1 for step in rows.stats.accepted_per_step if step[j] > 0)
                rec = {"setting": name, "id": p["id"], "category": p["category"], "prompt_tokens": len(ids),
                       "tokens": len(rows.out[j]), "forwards": max(forwards, 1), "ids": rows.out[j]}
                if p.get("answers"):
                    rec["correct"] = is_correct(tokenizer.decode(rows.out[j], skip_special_tokens=True), p["answers"],
                                                p.get("rule", "contains"))
                f.write(json.dumps(rec) + "\n")
        log(f"{name}: {i + len(chunk)}/{len(encoded)} ({time.time() - start:.0f} s)")


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where a and b differ, None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summarise(out_path: str, only: set | None = None) -> dict:
    """{setting: {category | "overall": {tokens_per_forward, identical, first_difference, n}}}, over
    the prompts whose ids are in `only` (all when None): a sweep of a subset in a folder that also
    holds other prompts' outputs summarises that subset."""
    with open(out_path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if only is None or r["id"] in only]
    ar = {r["id"]: r["ids"] for r in rows if r["setting"] == "ar"}
    groups = {}
    for r in rows:
        groups.setdefault((r["setting"], r["category"]), [])
        groups.setdefault((r["setting"], "overall"), [])
    for r in rows:
        groups[(r["setting"], r["category"])].append(r)
        groups[(r["setting"], "overall")].append(r)
    summary = defaultdict(dict)
    for (setting, category), rs in groups.items():  # settings in the order they ran
        diffs = [first_difference(r["ids"], ar[r["id"]]) for r in rs if r["id"] in ar]
        differing = [d for d in diffs if d is not None]
        summary[setting][category] = {
            "n": len(rs),
            "tokens_per_forward": round(sum(r["tokens"] for r in rs) / sum(r["forwards"] for r in rs), 3),
            "identical": round(1 - len(differing) / len(diffs), 3) if diffs else None,
            "first_difference": round(sum(differing) / len(differing), 1) if differing else None,
        }
        scored = [r["correct"] for r in rs if "correct" in r]
        if scored:
            summary[setting][category]["accuracy"] = round(sum(scored) / len(scored), 3)
    return dict(summary)


def tau_of(setting: str) -> float | None:
    return float(setting[len("mars-"):].removesuffix("-guard")) if setting.startswith("mars-") else None


def ordered(summary: dict) -> list[str]:
    """The settings as AR, MARS from the highest tau down, then lossless, whatever order a sweep
    run in stages wrote them in."""
    return sorted(summary, key=lambda s: (s != "ar", s.startswith("lossless"), s != "lossless", -(tau_of(s) or 0.0),
                                          s.endswith("-guard")))


def table(summary: dict) -> str:
    """A markdown table: rows = categories, columns = settings (T/F, identical share). A setting
    decoded on fewer prompts than the others (a sweep in stages) says how many in its heading, so
    an "overall" row over different prompts is not read as one comparison."""
    names = ordered(summary)
    cats = sorted({c for s in summary.values() for c in s if c != "overall"}) + ["overall"]
    n = {s: summary[s].get("overall", {}).get("n") for s in names}
    most = max((v for v in n.values() if v), default=None)
    heads = [s if n[s] in (None, most) else f"{s} ({n[s]} prompts)" for s in names]
    lines = ["| category | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(names)]
    for c in cats:
        cells = []
        for s in names:
            m = summary[s].get(c)
            cells.append("-" if m is None else f"{m['tokens_per_forward']:.2f}"
                         + ("" if s == "ar" or m["identical"] is None else f" ({m['identical']:.0%})"))
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-mars")
    p.add_argument("--layers", default=None,
                   help="a training snapshot whose layers replace the model's (a gated stage's: its adapters are added)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--spec-bench")
    src.add_argument("--self-instruct")
    src.add_argument("--prompts")
    p.add_argument("--out", required=True)
    p.add_argument("--taus", default="1,0.95,0.9,0.8")
    p.add_argument("--no-lossless", action="store_true")
    p.add_argument("--no-ar", action="store_true", help="skip AR (then no identity figures)")
    p.add_argument("--repeat-guard", action="store_true",
                   help="also decode each tau with the repeat guard (mars-T-guard: DecodeConfig.repeat_guard)")
    p.add_argument("--guard-only", action="store_true", help="decode each tau with the repeat guard only (half "
                   "the time of --repeat-guard where only the guarded figure is wanted)")
    p.add_argument("--draft-groups", default="all", help="lossless layout: all, last or ends")
    p.add_argument("--prompt-lookup", type=int, default=0,
                   help="also lossless MARS with prompt-lookup drafts where an n-gram of at least this length matched")
    p.add_argument("--prompt-lookup-tokens", type=int, default=None,
                   help="the most drafts such a lookup proposes (default block_size - 1)")
    p.add_argument("--draft-trees", default="",
                   help="also lossless MARS with these draft trees, widths per distance: '2,2,1 2,1,1'")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--per-category", type=int, default=None, help="only the first N prompts of each category")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    kind, path = next((k, v) for k, v in (("spec-bench", args.spec_bench), ("self-instruct", args.self_instruct),
                                          ("ours", args.prompts)) if v)
    try:
        taus = [float(t) for t in args.taus.split(",") if t.strip()]
        configs = settings(taus, not args.no_lossless, args.block_size, not args.no_ar, args.draft_groups,
                           args.prompt_lookup, args.prompt_lookup_tokens, tuple(parse_trees(args.draft_trees)),
                           args.repeat_guard, args.guard_only)
        prompts = read_set(kind, path, args.limit, args.per_category)
        model, tokenizer = load_model(args.model, dtype="float32")
    except (ValueError, OSError) as e:
        print(f"error: {e}")
        return 2
    if args.layers:
        saved = torch.load(args.layers, map_location="cpu")
        if "gate" in saved:  # a mask-gated stage's snapshot: its adapters on the base
            install_gate(model, saved["gate"], tokenizer.mask_token_id)
        unexpected = [] if "gate" in saved else model.load_state_dict(saved["layers"], strict=False).unexpected_keys
        if unexpected:
            print(f"error: {args.layers} holds weights this model does not have: {unexpected[:3]}")
            return 2
    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "outputs.jsonl")
    with torch.inference_mode():
        for name, config in configs.items():
            run_setting(model, tokenizer, name, config, prompts, out_path, args.batch_size, args.max_new_tokens,
                        log=lambda s: print(s, flush=True))
    summary = summarise(out_path, {p["id"] for p in prompts})
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
