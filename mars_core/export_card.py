"""The model card (README.md) of an exported folder: Hub front matter, five lines of usage, the
MARS defaults, the evaluation table when the source has an `eval.json`, what the export changed,
and the source's own card below."""
from __future__ import annotations

import re

FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n?", re.S)


def model_card(name: str, config: dict, mars: dict, tokenizer_class: str, hashes: dict[str, str],
               notes: list[str], eval_json: dict | None, source_card: str | None) -> str:
    license_ = _front_matter_value(source_card, "license")
    head = ["---", "library_name: transformers", "pipeline_tag: text-generation", "tags: [custom_generate, mars]"]
    if license_:
        head.append(f"license: {license_}")
    head.append("---")
    body = [
        f"# {name}: MARS (Mask AutoRegression)",
        "",
        f"A stock `{config['architectures'][0]}` fine-tuned with MARS (Jin et al., 2026, arXiv 2604.07023): "
        "one forward reads a block of `[MASK]` predictions after the prefix and keeps them left to right "
        "while the model is confident (probability >= `tau`), so it emits several tokens per forward; at "
        "`tau = 1` it is exactly AR decoding. No new parameters, no remote modeling code: the decoding "
        "method is `custom_generate/`, generated from the `mars_core` library.",
        "",
        "## Usage",
        "",
        "```python",
        f"from transformers import AutoModelForCausalLM, {tokenizer_class}",
        f'tok, model = {tokenizer_class}.from_pretrained("{name}"), AutoModelForCausalLM.from_pretrained("{name}")',
        'inputs = tok.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}], '
        'add_generation_prompt=True, return_tensors="pt", return_dict=True)',
        f'out = model.generate(**inputs, custom_generate="{name}", trust_remote_code=True, tau={mars["tau"]}, '
        "max_new_tokens=128)",
        'print(tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```",
        "",
        f'`"{name}"` is this repository (its Hub id, or the local folder). Without `custom_generate` the '
        "model decodes as any causal LM, one token per forward. Loading with "
        "`from_pretrained(..., trust_remote_code=True)` makes MARS its default `generate`.",
        "",
        "| setting | default | meaning |",
        "|---|---|---|",
        f"| `mode` | `{mars['mode']}` | `mars`; `ar` (one token per forward); any other mode of `mars_core.DecodeConfig` |",
        f"| `tau` | {mars['tau']} | acceptance threshold; 1.0 = AR output token for token |",
        f"| `block_size` | {mars['block_size']} | predictions per forward |",
        "| `kv_cache` | `cursor` | `cursor`, `none` (the reference, no KV cache) |",
        f"| `mask_token_id` | {mars['mask_token_id']} | the `<|mask|>` id (from `generation_config.json`) |",
        "",
        "`return_dict_in_generate=True` adds `accept_counts` (forwards x batch): the tokens each row accepted "
        "per forward. Batches need left padding; a `streamer` receives one `put` per forward. Sampling "
        "(`do_sample=True`) uses the temperature only.",
    ]
    table = eval_table(eval_json)
    if table:
        body += ["", "## Evaluation", ""] + table
    body += ["", "## Export", "", "Written by `python -m mars_core.export` (MARS Playground).", ""]
    body += [f"- {n}" for n in notes]
    body += [f"- `{f}` copied byte for byte, sha256 `{h}`" for f, h in sorted(hashes.items())]
    if source_card:
        rest = FRONT_MATTER.sub("", source_card).strip()
        rest = re.sub(r"^(#+) ", r"#\1 ", rest, flags=re.M)  # one level below this card's title
        body += ["", "## The source model's card", "", rest]
    return "\n".join(head + [""] + body) + "\n"


def eval_table(eval_json: dict | None) -> list[str]:
    """Markdown rows for the runs of an eval.json (mars_core's training pipeline writes one)."""
    runs = (eval_json or {}).get("runs")
    if not isinstance(runs, list) or not runs:
        return []
    n, split = eval_json.get("n", "?"), eval_json.get("split", "?")
    rows = [f"{n} held-out problems ({split} split), greedy, as recorded in `eval.json`:", "",
            "| model | decoding | block size | tau | accuracy | tokens per forward |", "|---|---|---|---|---|---|"]
    for r in runs:
        if not isinstance(r, dict) or "accuracy" not in r:
            continue
        ar = r.get("mode") == "ar"
        rows.append(f"| {r.get('model', '-')} | {'AR' if ar else r.get('mode', '?')} | {1 if ar else r.get('block_size', '-')} "
                    f"| {'-' if ar else r.get('tau', '-')} | {100 * r['accuracy']:.1f}% | "
                    f"{r.get('tokens_per_forward', float('nan')):.2f} |")
    return rows if len(rows) > 4 else []


def _front_matter_value(card: str | None, key: str) -> str | None:
    m = FRONT_MATTER.match(card or "")
    if not m:
        return None
    found = re.search(rf"^{key}:\s*(\S.*)$", m.group(1), flags=re.M)
    return found.group(1).strip() if found else None


def method_card() -> str:
    """README.md of a repository that holds only the decoding method (`--method-only`)."""
    return "\n".join([
        "---", "library_name: transformers", "tags: [custom_generate, mars]", "---", "",
        "# MARS decoding (Mask AutoRegression) for `transformers`",
        "",
        "Several tokens per forward from a causal LM fine-tuned with MARS (Jin et al., 2026, arXiv "
        "2604.07023): each forward reads `block_size` `[MASK]` predictions after the prefix and keeps "
        "them left to right while their probability is >= `tau`; `tau = 1` is AR decoding token for token. "
        "This repository holds only the decoding method, generated from the `mars_core` library by "
        "`python -m mars_core.export --method-only`; do not edit it by hand.",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'tok, model = AutoTokenizer.from_pretrained("MODEL"), AutoModelForCausalLM.from_pretrained("MODEL")',
        'inputs = tok.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}], '
        'add_generation_prompt=True, return_tensors="pt", return_dict=True)',
        'out = model.generate(**inputs, custom_generate="THIS_REPO", trust_remote_code=True, '
        'mask_token_id=tok.convert_tokens_to_ids("<|mask|>"), tau=0.95, block_size=4, max_new_tokens=128)',
        'print(tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```",
        "",
        "`MODEL` must be a stock causal LM trained with MARS whose tokenizer has the mask token (a folder "
        "written by `python -m mars_core.export` records `mask_token_id` and the defaults in its "
        "`generation_config.json` and carries this folder itself). Arguments: `mode` (`mars`, `ar`, or "
        "`lossless`: exactly greedy `generate`'s tokens, several per forward), `tau`, `block_size`, `metric` (`probability`, "
        "`entropy`, `margin`), `kv_cache` (`cursor`, the default, or `none`), "
        "`max_accept`, `repeat_guard` (with `mars`: refuse a mask's token equal to the token before it; a "
        "mask-gated folder defaults to it), `seed`, `tau_control`; with `lossless`, greedy, the draft shape: "
        "`draft_groups`, "
        "`draft_tree`, `draft_budget`, `prompt_lookup`, `prompt_lookup_tokens` (the MARS Playground's "
        "`generate_kwargs(fastest_exact(model, tok))` gives the fastest exact shape on the machine it runs on, "
        "measured there); plus `max_new_tokens`, `do_sample`, `temperature`, "
        "`streamer` (one `put` per forward, batch of one) and `return_dict_in_generate` (adds "
        "`accept_counts`, forwards x batch). Batches need left padding and `attn_implementation='sdpa'`.",
        "",
    ])
