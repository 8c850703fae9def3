"""Model cards for the bundled models, written from what the build measured (nothing typed in)."""
from __future__ import annotations

import filecmp
import os
import shutil

from tasks import families as syn
from training.checkpoint import write_text
from training.evaluate import summary_table
from training.recipe import Recipe


def _family_table(runs: list[dict]) -> str:
    families = sorted({f for r in runs for f in r["accuracy_by_family"]})
    head = "| run | " + " | ".join(families) + " | all |\n|---|" + "---|" * (len(families) + 1)
    rows = []
    for r in runs:
        name = f"{r['model']} {r['mode']}" + ("" if r["mode"] == "ar" else f" B={r['block_size']} τ={r['tau']}")
        cells = " | ".join(f"{100 * r['accuracy_by_family'].get(f, 0):.1f}%" for f in families)
        rows.append(f"| {name} | {cells} | {100 * r['accuracy']:.1f}% |")
    return head + "\n" + "\n".join(rows)


def _training_lines(summaries: dict) -> str:
    lines = ["| stage | output | steps | lr | block size | ar_weight | time | tokens/s | peak memory |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        lines.append(f"| {s['stage']} | {name} | {s['steps']} | {s['lr']} | {s.get('block_size') or '-'} | "
                     f"{s.get('ar_weight') if s.get('ar_weight') is not None else '-'} | "
                     f"{s['seconds'] / 60:.1f} min | {s['tokens_per_s']:.0f} | {s['peak_memory_mb']:.0f} MB |")
    return "\n".join(lines)


def card(title: str, summary: str, recipe: Recipe, summaries: dict, result: dict, ablations: list[dict]) -> str:
    r = recipe
    main_runs = [x for x in result["runs"] if x["mode"] == "ar" or x["tau"] in (1.0, 0.95)]
    steps_note = "" if r.ablation_steps == r.mars_steps else (
        f", but {r.mars_steps} steps instead of {r.ablation_steps}: three MARS runs of {r.mars_steps} steps "
        "do not fit the 2-hour build (docs/experiments.md lists a 900-step comparison)")
    return f"""---
license: apache-2.0
library_name: transformers
pipeline_tag: text-generation
tags: [mars, multi-token-prediction, qwen2, synthetic]
---

# {title}

{summary}

Built from scratch on a 2-core CPU by this repository's own pipeline:

```bash
python -m training.build_default --output runs/default --install assets/models
```

## Recipe

- Architecture: stock `Qwen2ForCausalLM`, preset `{r.model_config}`
  ({summaries['ar']['num_parameters']:,} parameters), our byte-level BPE tokenizer
  (vocabulary {r.vocab_size}, every digit its own token, `<|mask|>` added), chat template
  `<|user|>\\n...<|end|>\\n<|assistant|>\\n`.
- Data: `tasks.synthetic` train split, {r.train_examples:,} examples (seed {r.seed}): 60% arithmetic
  word problems (1-3 steps of +, -, *, / on values up to {syn.MAX_VALUE}: start values
  {syn.START_RANGE[0]}-{syn.START_RANGE[1]}, amounts {syn.ADD_RANGE[0]}-{syn.ADD_RANGE[1]}, factors and divisors
  {syn.FACTOR_RANGE[0]}-{syn.FACTOR_RANGE[1]} with the multiplication and division work shown), 20% unit
  conversions, 20% list manipulation (4-7 two-digit numbers, 3-5 for sums: sort, reverse, max,
  min, sum); one templated line per step, answers end in `#### <answer>`.
- Stage 1 (AR SFT): {r.ar_steps} steps, batch {r.batch_size}, AdamW lr {r.ar_lr}, cosine with 3% warm-up.
- Stage 2 (MARS): from stage 1, block size {r.block_size}, `ar_weight` {r.ar_weight} (the SFT loss),
  {r.mars_steps} steps, lr {r.mars_lr}. Ablations: `ar_weight` 0 ("w/o SFT loss"), {r.ablation_steps} steps,
  the same lr and data.
- Seeds: data {r.seed}, training {r.seed}, evaluation split `eval` seed {r.seed} (disjoint from train).

{_training_lines(summaries)}

## Results ({result['n']} held-out problems, greedy, max {r.max_new_tokens} new tokens, sliding KV cache, batch {result['batch_size']})

T/F = tokens per forward per sequence (counted). "= AR": share of problems whose MARS output equals
this model's own AR output token for token. Tokens/s are this CPU's, batch {result['batch_size']}, and are
not the benchmark (see `python -m benchmarks.bench`).

{summary_table(result)}

Per task family:

{_family_table(main_runs)}

### Ablation: MARS without the SFT loss (`ar_weight = 0`)

{summary_table({"runs": ablations}) if ablations else "not run"}

Compare the one-token (`ar`) rows with the `mars` model's `ar` row above: the MARS stage with the SFT
loss, the same learning rate and data{steps_note}.
Only B = {r.block_size} was trained with the SFT loss.

The speed-quality frontier: `frontier.html` (and `frontier.png` where it could be exported).
"""


def write_cards(output: str, recipe: Recipe, summaries: dict, result: dict, ablations: list[dict]) -> None:
    ar_name, mars_name = "tiny-ar-sft", f"tiny-mars-b{recipe.block_size}"
    texts = {
        ar_name: ("tiny-ar-sft: the AR baseline",
                  "A few-million-parameter causal LM trained with plain AR SFT on the synthetic tasks: the "
                  "baseline of MARS Playground and the starting point of its MARS fine-tune."),
        mars_name: (f"{mars_name}: MARS fine-tune (block size {recipe.block_size})",
                    "The AR baseline fine-tuned with MARS (Mask AutoRegression): the same stock Qwen2 "
                    "architecture, no new parameters, emitting several tokens per forward when confident "
                    "and exactly AR at tau = 1."),
    }
    eval_dir = os.path.join(output, "eval")
    for name, (title, summary) in texts.items():
        folder = os.path.join(output, name)
        write_text(os.path.join(folder, "README.md"), card(title, summary, recipe, summaries, result, ablations))
        for extra in ("eval.json", "frontier.html", "frontier.png"):
            src, dst = os.path.join(eval_dir, extra), os.path.join(folder, extra)
            if os.path.isfile(src) and not (os.path.isfile(dst) and filecmp.cmp(src, dst, shallow=False)):
                shutil.copy2(src, dst)


def draft_card(recipe: Recipe, summary: dict, result: dict) -> str:
    """The card of the small draft model: what it is for and what it measured, drafting for the
    MARS model against the same-size AR model as the draft."""
    r = recipe
    lines = ["| run | accuracy | tokens per target forward | draft acceptance | draft forwards per target forward |",
             "|---|---:|---:|---:|---:|"]
    for x in result["runs"]:
        acc = "-" if x["draft_acceptance"] is None else f"{100 * x['draft_acceptance']:.1f}%"
        dpf = "-" if not x["draft_forwards"] else f"{x['draft_forwards'] / max(x['forwards'], 1):.2f}"
        lines.append(f"| {x['run']} | {100 * x['accuracy']:.1f}% | {x['tokens_per_forward']:.2f} | {acc} | {dpf} |")
    return f"""---
license: apache-2.0
library_name: transformers
pipeline_tag: text-generation
tags: [mars, speculative-decoding, draft-model, qwen2, synthetic]
---

# tiny-draft: a small draft model for speculative decoding

A {result['num_parameters']:,}-parameter stock Qwen2 (preset `{r.draft_config}`) trained with plain AR SFT on the
same synthetic tasks and tokenizer as tiny-ar-sft and tiny-mars-b4, to propose tokens that a
target verifies (`DecodeConfig(mode="spec", draft_tokens=K)`, `generate(..., draft_model=...)`).
On a CPU a forward of this model costs about a third of one of the 3.3M-parameter models (per-layer
overhead dominates), so it drafts more cheaply than the same-size AR model, at a lower acceptance.

Built by `python -m training.build_default` (stage `tiny-draft`): {r.draft_steps} steps, batch {r.batch_size},
AdamW lr {r.ar_lr}, cosine with 3% warm-up, the AR stage's data ({r.train_examples:,} examples, seed {r.seed});
{summary['seconds'] / 60:.1f} min, {summary['tokens_per_s']:.0f} training tokens/s.

## Results ({result['n']} held-out problems, greedy, batch {result['batch_size']}, K = {result['draft_tokens']})

The target is tiny-mars-b4. "spec" is exact: its output is the target's own AR output. Tokens per
target forward count the target's forwards only; the draft's are extra work (last column). Speed
depends on the hardware: `python -m benchmarks.bench --draft-model assets/models/tiny-draft`.

{chr(10).join(lines)}
"""


def write_draft_card(folder: str, recipe: Recipe, summary: dict, result: dict) -> None:
    write_text(os.path.join(folder, "README.md"), draft_card(recipe, summary, result))
