"""The card of the real MARS model (assets/models/smollm2-135m-mars/), written from what was measured.

Reads the training run (its args, log and curve) and the `benchmarks.real_eval` folders of the
evaluations, and writes next to the delta: `README.md` (the model card), `training_config.json`
(the recipe), `eval.json` (the known-answer and GSM8K sweep the playground's Frontier tab
draws) and `eval_summaries.json` (every evaluation summary the card was written from). Nothing is
typed in: a figure that was not measured is absent from the card.

The bulky inputs (a run's checkpoints, the decoded outputs) live in `runs/`, which a new machine does
not have, so a card can be refreshed from what the repository keeps: an evaluation not given as a
folder is taken from the card's own `eval_summaries.json`, and without `--run` the training section
(and `training_config.json`) of the card already in OUT stay as they were written.

    python -m benchmarks.real_card --run runs/main --self-instruct runs/eval-si --spec-bench runs/eval-sb \
        --known runs/eval-known --known-base runs/eval-known-base --out assets/models/smollm2-135m-mars
"""
from __future__ import annotations

import argparse
import json
import os

from benchmarks.real_eval import ordered, tau_of, table

def _read(path: str | None):
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f) if path.endswith(".json") else [json.loads(line) for line in f if line.strip()]


EVALS = ("self-instruct", "spec-bench", "spec-bench-base", "known", "known-base")


def _summary(folder: str | None) -> dict | None:
    return _read(os.path.join(folder, "summary.json")) if folder else None


def kept_training_section(card_path: str) -> list[str]:
    """The lines of an existing card from its "## Training (measured)" heading up to the next
    second-level heading (its "### Training curve" included): a card refreshed without the run
    keeps the training record it was first written with."""
    lines = []
    if os.path.isfile(card_path):
        with open(card_path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    if "## Training (measured)" not in lines:
        raise ValueError(f"no --run given and {card_path} has no '## Training (measured)' section to keep: "
                         "give the training run's folder (args.json, log.jsonl, curve/curve.json)")
    start = lines.index("## Training (measured)")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


CONTINUED = "### Continued from the shipped gate"


def continued_from(targs: dict) -> str | None:
    """The shipped model folder a gated run continued from (`gated_stage --init FOLDER`, which holds
    a training_config.json), or None: that folder's run is gone, its card is the record of it."""
    init = targs.get("init")
    return init if init and os.path.isfile(os.path.join(init, "training_config.json")) else None


def continuation(kept: list[str], targs: dict, log: list[dict], curve: list[dict] | None) -> list[str]:
    """The card's training record of the earlier stages as it was written (up to an earlier
    continuation's subsection, which this one replaces), then this run: its stage, the CPU-minutes
    of all stages, and its own curve."""
    if CONTINUED in kept:
        kept = kept[: kept.index(CONTINUED)]
    total = log[-1].get("cpu_minutes") if log else None
    lines = [*kept, CONTINUED, "", _stage_line(targs, log, first=False)]
    if total is not None:
        lines += ["", f"{total:.0f} CPU-minutes in all, every stage ({_threads(targs.get('threads'))} of "
                      f"{cpu_name()} for this one)."]
    return lines + ["", curve_caption(targs), "", curve_table(curve), ""]


def legend(summary: dict) -> list[str]:
    """What the named columns mean (`benchmarks.real_eval.settings` names them: the repeat guard's,
    and lossless other than plain), as lines to put under a table; none when neither ran."""
    lines = []
    if any(s.endswith("-guard") for s in summary):
        lines += ["mars-T-guard: tau T with the repeat guard (`repeat_guard=True`: a mask's token equal to the "
                  "token before it is not accepted; the next forward's AR head decides it).", ""]
    if any(s.startswith("lossless") and s != "lossless" for s in summary):
        lines += ["lossless: its mask groups after every possible accept count (\"all\"); lossless-lookupN: drafting "
                  "by prompt lookup where the text's last N-gram occurred before (`prompt_lookup=N`), by its masks "
                  "elsewhere; -LM: up to M lookup drafts (else block size - 1); a last part names another group "
                  "layout (\"last\": one group, after the last draft, as the benchmark's `mars-lossless-lookup` "
                  "row); lossless-treeA-B-C: drafting a tree of the top A, B, C mask candidates at distance 1, 2, 3 "
                  "in every combination, a group of masks after every node (`draft_tree=(A, B, C)`).", ""]
    return lines


def _threads(n) -> str:
    """How the card names the training run's `--threads` (None: the run did not record it)."""
    if n is None:
        return "the threads"
    return "both threads" if n == 2 else "1 thread" if n == 1 else f"{n} threads"


def frontier(known: dict | None, known_base: dict | None, spec: dict | None, model: str,
             spec_base: dict | None = None) -> dict | None:
    """eval.json: accuracy against tokens per forward for each setting (known answers and
    GSM8K-style math_reasoning pooled), in the runs format `training.evaluate` writes. The base's
    point pools the same sets as the fine-tune's, or math_reasoning stays out of every point."""
    # math_reasoning joins only when enough of it was decoded to be an accuracy
    math = bool(spec) and all(v.get("math_reasoning", {}).get("n", 0) >= 20 for v in spec.values())
    if known_base and math and not (spec_base or {}).get("ar", {}).get("math_reasoning"):
        math = False  # a base point of known answers only against MARS points with math would mislead
    sets = [(known, "known-answers")] + ([(spec, "math_reasoning")] if math else [])
    base_sets = [(known_base, "known-answers")] + ([(spec_base, "math_reasoning")] if math else [])
    runs = []

    def pooled(summary_sets, setting):
        """The setting's point over every set given, or None where a set lacks it (a point of the
        known answers alone among points that pool math too would not be comparable)."""
        got = [(s[setting][c]) for s, c in summary_sets if s and setting in s and c in s[setting]
               and "accuracy" in s[setting][c]]
        if not got or len(got) < sum(1 for s, _ in summary_sets if s):
            return None
        n = sum(g["n"] for g in got)
        return {"n": n, "accuracy": round(sum(g["accuracy"] * g["n"] for g in got) / n, 4),
                "tokens_per_forward": round(sum(g["tokens_per_forward"] * g["n"] for g in got) / n, 3)}

    if known_base and "ar" in known_base:
        p = pooled(base_sets, "ar")
        if p:
            runs.append({"model": "smollm2-135m-instruct", "mode": "ar", "tau": 1.0, "block_size": 1,
                         "tokens_per_second": None, **p})
    for setting in (known or {}):
        p = pooled(sets, setting)
        if p is None:
            continue
        mode = "ar" if setting == "ar" else "lossless" if setting.startswith("lossless") else "mars"
        named = mode == "lossless" or setting.endswith("-guard")  # a row of its own beside plain tau
        runs.append({"model": f"{model} ({setting})" if named else model, "mode": mode,
                     "tau": tau_of(setting) if mode == "mars" else 1.0,
                     "block_size": 1 if mode == "ar" else 4, "tokens_per_second": None, **p,
                     **({"repeat_guard": True} if setting.endswith("-guard") else {})})
    if not runs:
        return None
    n = max(r["n"] for r in runs)
    return {"n": n, "split": " + ".join(c for _, c in sets), "runs": runs}


def curve_caption(targs: dict) -> str:
    if "targets" in targs:
        return ("Tokens per forward of exact decodes on self-instruct's first 48 instructions (the base's AR output, "
                "128 tokens), replayed exactly without decoding (`benchmarks.mask_replay`), against CPU-minutes; "
                "every one is the base's greedy output:")
    return ("Tokens per forward on 24 held-out prompts of ours (96 new tokens, greedy), in brackets the "
            "share of outputs identical to the same weights' AR output:")


def curve_table(points: list[dict] | None) -> str:
    if not points:
        return "(no curve measured)"
    cols = [k for k in points[0] if k not in ("snapshot", "minutes", "cpu") and not k.endswith("_identical")]
    head = "CPU-minutes" if points and points[0].get("cpu") else "training minutes"
    lines = [f"| snapshot | {head} | " + " | ".join(cols) + " |", "|---|---:|" + "---:|" * len(cols)]
    for p in points:
        cells = []
        for c in cols:
            same = p.get(f"{c}_identical")
            cells.append(f"{p[c]:.3f}" + ("" if same is None else f" ({same:.0%})"))
        lines.append(f"| {p['snapshot']} | {p['minutes']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def accuracy_table(summary: dict | None, category: str, base: dict | None = None) -> str:
    if not summary:
        return "(not measured)"
    lines = ["| model | decoding | prompts | accuracy | tokens per forward | identical to its AR |",
             "|---|---|---:|---:|---:|---:|"]
    if base and "ar" in base and category in base["ar"]:
        m = base["ar"][category]
        lines.append(f"| base | AR | {m['n']} | {m['accuracy']:.1%} | {m['tokens_per_forward']:.2f} | - |")
    for s in ordered(summary):
        m = summary[s].get(category)
        if m and "accuracy" in m:
            same = "-" if s == "ar" or m["identical"] is None else f"{m['identical']:.0%}"
            lines.append(f"| MARS fine-tune | {s} | {m['n']} | {m['accuracy']:.1%} | {m['tokens_per_forward']:.2f} | {same} |")
    if any(cats.get(category, {}).get("n", 99) < 20 for cats in summary.values()):
        lines.append("\nFewer than 20 prompts: an example of outputs, not a measured accuracy.")
    return "\n".join(lines)


def spec_bench_scope(summary: dict) -> str:
    """Which prompts of Spec-Bench a sweep decoded, from its summary: all 480, the first N of each
    category, or a count."""
    cats = {c: m["n"] for c, m in summary.get("ar", next(iter(summary.values()))).items() if c != "overall"}
    total = sum(cats.values())
    if total == 480:
        return "All 480 prompts"
    if len(set(cats.values())) == 1:
        n = next(iter(cats.values()))
        first = "The first prompt" if n == 1 else f"The first {n} prompts"
        return f"{first} of each of its {len(cats)} categories ({total} prompts)"
    return f"{total} prompts"


def divergence_line(summary: dict | None) -> str:
    if not summary:
        return ""
    parts = [f"{s}: {summary[s]['overall']['first_difference']}" for s in ordered(summary)
             if s != "ar" and summary[s]["overall"].get("first_difference") is not None]
    return ("Mean position of the first token that differs from AR, among outputs that differ: "
            + ", ".join(parts) + ".") if parts else ""


def _stage_line(targs: dict, log: list[dict], first: bool) -> str:
    last = log[-1] if log else {}
    if "targets" in targs:  # a mask-gated stage (training.gated_stage): adapters at mask positions only
        tail = log[-10:]
        losses = ", ".join(f"{k} {sum(r[k] for r in tail) / max(1, len(tail)):.2f}" for k in ("soft", "hard")
                           if tail and k in tail[0])
        where = "every decoder layer" if targs.get("layers") is None else f"the top {targs['layers']} layers"
        return (f"{'' if first else 'Then '}{last.get('step', '?')} optimizer steps of {targs.get('accum', '?')} examples "
                f"(of {targs.get('epochs', '?')} epochs planned), mask-gated rank-{targs.get('rank', '?')} adapters on "
                f"{where} and the mask's embedding, the base frozen, {targs.get('groups') or 'all'} groups of masks a "
                f"visit, {targs.get('targets', '?')} targets, lr {targs.get('lr', '?')} (cosine), block size "
                f"{targs.get('block_size', '?')}; final loss (mean of the last 10 steps): {losses}.")
    how = (f"rank-{targs['lora_rank']} LoRA (scale {(targs.get('lora_alpha') or targs['lora_rank']) / targs['lora_rank']:g}) on the top "
           f"{targs.get('train_layers', '?')} layers, merged" if targs.get("lora_rank")
           else f"top {targs.get('train_layers', '?')} layers train")
    tail = log[-10:]
    return (f"{'' if first else 'Then '}{last.get('step', '?')} optimizer steps of {targs.get('accum', '?')} examples "
            f"({targs.get('epochs', '?')} epochs), {how}, lr {targs.get('lr', '?')} (cosine), ar_weight "
            f"{targs.get('ar_weight', '?')}, block size {targs.get('block_size', '?')}, max distance "
            f"{targs.get('max_distance', '-')}; final loss (mean of the last 10 steps): noisy "
            f"{sum(r['noisy'] for r in tail) / max(1, len(tail)):.2f}, clean {sum(r['clean'] for r in tail) / max(1, len(tail)):.2f}.")


def training_lines(run: str, targs: dict, log: list[dict]) -> list[str]:
    """One line per stage: a run started from another (`frozen_stage --init`) after that run's own
    stages, then the training minutes of all of them (the clock continues across stages)."""
    stages, folder, seen = [], run, set()
    while folder and os.path.realpath(folder) not in seen:
        seen.add(os.path.realpath(folder))
        a = targs if folder == run else (_read(os.path.join(folder, "args.json")) or {})
        lg = log if folder == run else (_read(os.path.join(folder, "log.jsonl")) or [])
        stages.append((a, lg))
        init = a.get("init")
        folder = os.path.dirname(init) if init else None
        if folder and os.path.basename(folder) == "snapshots":
            folder = os.path.dirname(folder)
    stages.reverse()
    lines = ["- " + _stage_line(a, lg, i == 0) for i, (a, lg) in enumerate(stages)]
    last = log[-1] if log else {}
    if "cpu_minutes" in last:  # the gated stage counts CPU time, across sittings and pauses
        return lines + ["", f"{last['cpu_minutes']:.0f} CPU-minutes in all ({_threads(targs.get('threads'))}, "
                            f"{cpu_name()}), across several sittings."]
    return lines + ["", f"{last.get('minutes', '?')} training minutes in all on {_threads(targs.get('threads'))} of a 2-core AVX2 CPU."]


def cpu_name() -> str:
    """The CPU a run was measured on, as /proc/cpuinfo names it, with its bf16 support."""
    from mars_core.cpu import native_bf16

    name = "a CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {'native bf16' if native_bf16() else 'no native bf16'}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", default=None, help="the training run (args.json, log.jsonl, curve/curve.json); "
                   "without it the card in OUT keeps its training section")
    for name in EVALS:
        p.add_argument(f"--{name}", default=None, help="a benchmarks.real_eval output folder "
                       "(default: the summary the card in OUT was written from)")
    p.add_argument("--step", type=int, default=None, help="with --run: the shipped snapshot's step (the log and "
                   "the curve are read up to it; default: the run's last step)")
    p.add_argument("--intro", required=True, help="a markdown file: the card's prose (what, how, limits)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        training = (None if args.run else kept_training_section(os.path.join(args.out, "README.md")))
    except ValueError as e:
        p.error(str(e))
    kept = _read(os.path.join(args.out, "eval_summaries.json")) or {}
    evals = {}
    for name in EVALS:
        folder = getattr(args, name.replace("-", "_"))
        evals[name] = _summary(folder) if folder else kept.get(name)
        if folder and evals[name] is None:
            p.error(f"--{name} {folder}: no summary.json there (a benchmarks.real_eval --out folder has one)")
    si, sb = evals["self-instruct"], evals["spec-bench"]
    known, known_base = evals["known"], evals["known-base"]
    sb_base = evals["spec-bench-base"]  # the base's AR on (some of) Spec-Bench: its math accuracy
    with open(args.intro, encoding="utf-8") as f:
        intro = f.read().strip()
    if training is None:
        targs = _read(os.path.join(args.run, "args.json")) or {}
        log = _read(os.path.join(args.run, "log.jsonl")) or []
        curve = _read(os.path.join(args.run, "curve", "curve.json"))
        if args.step is not None:  # the run went on after the snapshot this card describes
            log = [r for r in log if r["step"] <= args.step]
            curve = [c for c in curve or [] if int(c["snapshot"].split()[-1]) <= args.step]
        if continued_from(targs):
            try:
                training = continuation(kept_training_section(os.path.join(args.out, "README.md")), targs, log, curve)
            except ValueError as e:
                p.error(str(e))
        else:
            training = ["## Training (measured)", "", *training_lines(args.run, targs, log), "",
                        "### Training curve", "",
                        curve_caption(targs), "", curve_table(curve), ""]
    body = [intro, "", *training]
    if si:
        n = si.get("ar", next(iter(si.values())))["overall"]["n"]
        body += ["## Held-out prompts: self-instruct's user-oriented instructions", "",
                 f"{n} prompts (yizhongw/self-instruct, `human_eval/user_oriented_instructions.jsonl`), greedy. "
                 "Cells: mean tokens per forward (share identical to this model's AR output).", "",
                 table(si), "", *legend(si), divergence_line(si), ""]
    if sb:
        body += ["## Spec-Bench", "",
                 f"{spec_bench_scope(sb)} of Spec-Bench (hemingkx/Spec-Bench, Apache-2.0; the first turn of each question), "
                 "greedy, max_new_tokens 256. Cells: mean accepted tokens per forward (share of outputs identical "
                 "to this model's AR output).", "", table(sb), "", *legend(sb), divergence_line(sb), ""]
    body += ["## Quality where it can be checked", "",
             "Known answers (40 short factual and arithmetic questions of ours, `benchmarks/data/known_answers.jsonl`; "
             "correct when the answer appears as a word or a stand-alone number):", "",
             accuracy_table(known, "known-answers", known_base), "",
             "GSM8K-style `math_reasoning` of Spec-Bench (correct when the output's last number is the reference's):",
             "", accuracy_table(sb, "math_reasoning", sb_base), ""]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(body).rstrip() + "\n")
    if args.run:
        recipe = {k: v for k, v in targs.items() if k not in ("out", "lower", "threads", "build_cache")}
        last = log[-1] if log else {}
        config = {"status": "finished", "stage": "mars",
                  "args": {**recipe, "stage": "mars", "data_file": targs.get("data"), "data": "smollm2-self-distilled"},
                  "steps": last.get("step"), "minutes": last.get("minutes")}
        if "cpu_minutes" in last:  # `gated_stage --init FOLDER` continues the count from here
            config["cpu_minutes"] = round(last["cpu_minutes"], 1)
        with open(os.path.join(args.out, "training_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1)
    with open(os.path.join(args.out, "eval_summaries.json"), "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in evals.items() if v}, f, indent=1)
    result = frontier(known, known_base, sb, os.path.basename(os.path.normpath(args.out)), sb_base)
    if result:
        with open(os.path.join(args.out, "eval.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print(f"card -> {os.path.join(args.out, 'README.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
