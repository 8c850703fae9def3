"""How far richer drafts could lift lossless MARS on a model as it is: an exact replay, no decoding.

Lossless MARS emits j + 1 tokens a forward, j the drafts accepted (the B - 1 mask predictions
the previous forward made after the last accepted token). Its greedy output is the model's AR
output s, known from a `benchmarks.real_eval` run, so every step can be replayed without
decoding once the mask predictions after every prefix of s are known:

    M_t (B - 1, k): the top-k ids of each mask of a MARS forward of s[:t+1] + [MASK] * (B - 1);
                    mask m predicts s[t + 1 + m] (the token at t + 1 is the AR prediction).

One forward per prompt gives every M_t: s, then a group of B - 1 masks after every t that sees
s[:t+1] only (the one-forward layout of `verify_forward`, with a group after every position).
A replayed step at last emitted index c takes its drafts from M_{c-1} and accepts the longest
run j with s[c + i] among the candidates at distance i, then emits s[c+1..c+j+1]. With one
candidate a distance this is `mode="lossless"` (checked against the run's counted forwards);
with `widths` (k_1, k_2, ...) it is a draft tree (top-k_i at distance i, every combination:
k_1 + k_1 k_2 + ... nodes) verified in one forward. "+lookup" adds a second chain, prompt-lookup
drafts (the tokens that followed the latest earlier match of the text's last n-gram), and
keeps the better of the two.

These are upper bounds for such a decoder: it also needs, after every node it may accept, the
group of masks that drafts the next step (the "all" layout), so its forwards are wider; what a
width costs on a machine is `benchmarks.ceiling`'s business.
"""
from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

import torch

from mars_core import load_model
from mars_core.masks import for_model
from mars_core.prompts import encode_prompt, special_ids
from mars_core.tree import chain, parse_trees


def group_layout(L: int, first: int, B: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention (T, T) bool and position ids (T,) for s (L tokens) plus one group of B - 1 masks
    after every t = first..L - 1, in that order (T = L + (L - first)(B - 1)): the exact modes'
    window (`DraftShape.window`) of s[:first] as the prefix, s[first] as the root and the rest of
    s as a chain with a group after every node."""
    return chain(L - first - 1, B - 1).window(first)


def ngram_match(text: list[int], n_draft: int, max_ngram: int = 3) -> tuple[int, list[int]]:
    """The replay's own prompt-lookup search (an oracle of `mars_core.lookup`, written apart from
    it): the longest n <= max_ngram whose last n-gram occurred earlier, and up to n_draft tokens
    after its latest earlier occurrence."""
    for n in range(min(max_ngram, len(text) - 1), 0, -1):
        tail = tuple(text[len(text) - n:])
        starts = [i for i in range(len(text) - n) if tuple(text[i:i + n]) == tail]
        if starts:
            return n, text[starts[-1] + n:starts[-1] + n + n_draft]
    return 0, []


@torch.no_grad()
def mask_logits(model, s: list[int], first: int, mask_id: int, B: int) -> torch.Tensor:
    """(L - first, B - 1, V): row t - first holds the logits of the masks after s[:t+1]."""
    L, M = len(s), B - 1
    attn, pos = group_layout(L, first, B)
    ids = torch.tensor([s + [mask_id] * ((L - first) * M)])
    keep = torch.arange(L, attn.shape[0])
    logits = model(input_ids=ids, attention_mask=for_model(attn[None, None], model), position_ids=pos[None],
                   logits_to_keep=keep).logits[0]  # ((L - first) M, V)
    return logits.view(L - first, M, -1)


def mask_tops(model, s: list[int], first: int, mask_id: int, B: int, k: int) -> torch.Tensor:
    """(L - first, B - 1, k) long: row t - first holds M_t, the top-k ids of each mask after s[:t+1]."""
    return mask_logits(model, s, first, mask_id, B).topk(k, dim=-1).indices


def replay(s: list[int], first: int, tops: torch.Tensor, widths: tuple[int, ...], lookup: bool = False,
           memo: dict | None = None, switch: int = 0, lookup_tokens: int | None = None,
           lookup_groups: bool = True, groups: str = "all", trace: list | None = None) -> int:
    """Forwards a lossless decode with these drafts takes to emit s[first + 1:] (the prompt is s[:first + 1]).

    tops: `mask_tops(..., first, ...)`; widths: candidates kept per distance (len <= B - 1);
    lookup: a prompt-lookup chain beside the tree, the better branch counts; switch >= 1: one
    chain, the lookup drafts where the text's last `switch`-gram (or a longer one) occurred
    before, else the mask drafts; lookup_tokens: lookup drafts a step, at most (default
    B - 1, as `DecodeConfig`); lookup_groups False: a forward drafted by lookup carries no masks, so a next
    step without a lookup match has no drafts; groups "last" (the decoder's default layout, chains
    only): a forward carries masks only after its last draft, so a step that rejects one leaves
    the next without mask drafts ("all": after every draft); memo: a dict shared by replays of
    the same s; trace: a list that receives (drafts, carries masks) per forward."""
    memo = {} if memo is None else memo
    L = tops.shape[1] if lookup_tokens is None else lookup_tokens  # B - 1, as the decoders
    cand = [tops[:, i, :w].tolist() for i, w in enumerate(widths)]  # per distance: (G, w)
    c, forwards = first, 0
    started, group = False, False  # the first forward (the prompt's) has no drafts
    while c < len(s) - 1:
        j, copied, k = 0, False, 0
        if started:
            if (lookup or switch) and (c, L) not in memo:
                memo[(c, L)] = ngram_match(s[: c + 1], L)
            n, d = memo[(c, L)] if lookup or switch else (0, [])
            copied = bool(switch and n >= switch)
            k = len(d) if copied else len(widths) if group else 0
            if not copied and group:
                g = c - 1 - first  # the masks after the last accepted token, s[c - 1]
                while j < len(widths) and c + j + 1 < len(s) and s[c + j + 1] in cand[j][g]:
                    j += 1
            if lookup or copied:
                a = 0
                while a < len(d) and c + a + 1 < len(s) and s[c + a + 1] == d[a]:
                    a += 1
                j = max(j, a)
        c += j + 1
        forwards += 1
        carries = lookup_groups or not copied
        if trace is not None:
            trace.append((k, carries))
        started, group = True, carries and (groups == "all" or j == k)
    return forwards


def ar_text(tok, prompts: dict, ar: dict, stop_id: int) -> tuple[list[int], int]:
    """(s, first): the prompt of a real_eval `ar` record (from `prompts`, {id: record}) plus its
    output, and the index of the prompt's last token. The run stores the output without its stop
    token; where the forward that emitted it counted, it is put back. ValueError when the prompt
    is missing or encodes to another length than the run's."""
    pid = ar["id"]
    prompt = encode_prompt(tok, prompts[pid]["prompt"]) if pid in prompts else None
    if prompt is None or len(prompt) != ar["prompt_tokens"]:
        raise ValueError(f"prompt {pid!r} of the run is {'not in' if prompt is None else 'encoded differently from'} "
                         "the prompt file given (pass the file and the model the run used)")
    return prompt + ar["ids"] + ([stop_id] if ar["forwards"] > ar["tokens"] else []), len(prompt) - 1


def nodes(widths: tuple[int, ...]) -> int:
    """Draft tokens of a full tree with these widths: k_1 + k_1 k_2 + ..."""
    total, level = 0, 1
    for w in widths:
        level *= w
        total += level
    return total


def repeats(ids: list[int], n: int = 16) -> bool:
    """Whether some n tokens occur twice in `ids` (a small model looping on itself)."""
    seen = set()
    for i in range(len(ids) - n + 1):
        key = tuple(ids[i:i + n])
        if key in seen:
            return True
        seen.add(key)
    return False


def summarise(path: str) -> dict:
    """{group: {variant: tokens per forward}} over the replay records, per category, overall and
    for outputs with and without a repeated 16-gram; variant "measured" is the decoder's own count."""
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    variants = ["measured_lossless"] + [k for k in rows[0] if "," in k or k.startswith("switch-")]
    groups = defaultdict(list)
    for r in rows:
        groups[r["category"]].append(r)
        groups["overall"].append(r)
        groups["repeating" if r["repeats"] else "not repeating"].append(r)
    return {g: {"n": len(rs), **{v: round(sum(r["tokens"] for r in rs) / sum(r[v] for r in rs), 3) for v in variants}}
            for g, rs in sorted(groups.items(), key=lambda kv: (kv[0] in ("overall", "repeating", "not repeating"), kv[0]))}


def table(summary: dict) -> str:
    variants = [v for v in next(iter(summary.values())) if v != "n"]
    head = ["drafts (nodes)"] + [f"{g} ({s['n']})" for g, s in summary.items()]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for v in variants:
        if v == "measured_lossless":
            name = "lossless as decoded"
        elif v.startswith("switch-"):
            name = f"one chain: lookup where a {v[7:]}+-gram matched, else masks (3)"
        else:
            widths, _, extra = v.partition("+")
            w = tuple(int(x) for x in widths.split(","))
            name = f"top-{'/'.join(map(str, w))} ({nodes(w) + (len(w) if extra else 0)})" + (" + lookup" if extra else "")
            if not any(w):
                name = f"prompt lookup alone ({len(w)})"
        lines.append(f"| {name} | " + " | ".join(f"{s[v]:.2f}" for s in summary.values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.real_eval import read_set

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", help="a real_eval folder with the model's ar and lossless outputs")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--spec-bench", help="the prompt file that run read: Spec-Bench's question.jsonl, ...")
    src.add_argument("--self-instruct", help="... self-instruct's user_oriented_instructions.jsonl ...")
    src.add_argument("--prompts", help="... or a file of our own {id, prompt} records")
    p.add_argument("--model", default="smollm2-135m-mars")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--trees", default="1,1,1 2,1,1 2,2,1 3,2,1 4,2,2 8,1,1")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--out", required=True, help="a jsonl of per-prompt forwards (resumed)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--table", action="store_true", help="print the table of --out and stop")
    args = p.parse_args(argv)
    if args.table:
        print(table(summarise(args.out)))
        return 0
    sets = [(k, v) for k, v in (("spec-bench", args.spec_bench), ("self-instruct", args.self_instruct),
                                 ("ours", args.prompts)) if v]
    if not (args.run and sets):
        print("error: --run and the prompt file it read are needed (or --table to print a finished replay)")
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        trees = parse_trees(args.trees)
        if max(len(w) for w in trees) > args.block_size - 1:
            raise ValueError(f"a tree is deeper than block_size - 1 = {args.block_size - 1}")
        prompts = {r["id"]: r for r in read_set(*sets[0])}
        model, tok = load_model(args.model, dtype="float32")
    except (ValueError, OSError) as e:
        print(f"error: {e}")
        return 2
    mask_id, _, stop_ids = special_ids(model, tok)
    runs = defaultdict(dict)
    with open(os.path.join(args.run, "outputs.jsonl"), encoding="utf-8") as f:
        for r in map(json.loads, filter(str.strip, f)):
            runs[r["id"]][r["setting"]] = r
    done = set()
    if os.path.isfile(args.out):
        with open(args.out, encoding="utf-8") as f:
            done = {json.loads(line)["id"] for line in f if line.strip()}
    todo = [i for i, r in runs.items() if "ar" in r and "lossless" in r and i not in done][: args.limit]
    kmax = max(max(w) for w in trees)
    for n, pid in enumerate(todo):
        ar, ll = runs[pid]["ar"], runs[pid]["lossless"]
        try:
            s, first = ar_text(tok, prompts, ar, stop_ids[0])
        except ValueError as e:
            print(f"error: {e}")
            return 2
        with torch.inference_mode():
            tops = mask_tops(model, s, first, mask_id, args.block_size, kmax)
        rec = {"id": pid, "category": ar["category"], "tokens": ar["tokens"],
               "measured_lossless": ll["forwards"], "identical": ll["ids"] == ar["ids"],
               "repeats": repeats(ar["ids"])}
        memo: dict = {}
        for w in trees:
            rec[",".join(map(str, w))] = replay(s, first, tops, w)
            rec[",".join(map(str, w)) + "+lookup"] = replay(s, first, tops, w, lookup=True, memo=memo)
        depth = args.block_size - 1  # prompt lookup alone: no mask candidates, the lookup chain only
        rec[",".join(["0"] * depth) + "+lookup"] = replay(s, first, tops, (0,) * depth, lookup=True, memo=memo)
        for n_min in (1, 2, 3):  # one chain: lookup drafts where an n-gram of at least n_min matched
            rec[f"switch-{n_min}"] = replay(s, first, tops, (1,) * depth, memo=memo, switch=n_min)
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"{n + 1}/{len(todo)} {pid} {ar['category']}: measured {ll['forwards']}, "
              f"replayed {rec['1,1,1'] if (1, 1, 1) in trees else '-'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
