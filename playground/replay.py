"""The step-through replay: for one forward of the last MARS generation, what went in (the text so
far and the B - 1 masks), the B predictions that came out with their confidences, which of them
tau accepted and why the others were rejected (the paper's Figure 1, with the rejected ones)."""
from __future__ import annotations

import html

import torch

from mars_core.acceptance import passes

from .duel import Side, Step

RULE = {"probability": ("p", ">="), "margin": ("margin", ">="), "entropy": ("H", "<=")}


def decisions(step: Step, metric: str, repeat_guard: bool = False) -> list[tuple[str, str]]:
    """Per prediction: (mark, reason), mark one of "accepted", "rejected", "end". `repeat_guard`: the
    side refused a confident prediction equal to the one before it (`DecodeConfig.repeat_guard`)."""
    ok = passes(torch.tensor(step.confidences, dtype=torch.float64), step.tau, metric).tolist()
    name, op = RULE[metric]
    worse = "<" if op == ">=" else ">"
    out = []
    v = step.verified
    for j, c in enumerate(step.confidences):
        if v is not None and j < v:
            out.append(("accepted", "a draft (proposed before this forward: a mask prediction of the previous one, "
                        "a token copied from earlier in the text with prompt lookup, or the draft model's in spec), "
                        "verified: the model's own next-token prediction agrees, so it is exactly the AR token"))
        elif v is not None and j == v and j < step.accepted:
            out.append(("accepted", "the model's own AR prediction after the verified drafts (exact)"))
        elif j < step.accepted:
            why = (f"{name} {c:.2f} {op} tau {step.tau:g}" if ok[j] else
                   "the first prediction is always taken: it is the ordinary AR token")
            if j == 0 and ok[j]:
                why += " (the first prediction is taken in any case)"
            out.append(("accepted", why))
        elif j == step.accepted and step.finished and (ok[j] or j == 0):
            out.append(("end", "end of the answer (EOS) or the token limit: decoding stops here"))
        elif j == step.accepted and repeat_guard and ok[j] and step.proposed[j] == step.proposed[j - 1]:
            out.append(("rejected", f"{name} {c:.2f} {op} tau {step.tau:g}, but it repeats the prediction before "
                        "it: the repeat guard refuses it, and the next forward decides this position"))
        elif j == step.accepted:
            out.append(("rejected", f"{name} {c:.2f} {worse} tau {step.tau:g}: not confident enough"))
        else:
            out.append(("rejected", "comes after a rejected prediction: acceptance runs left to right and stops "
                        "at the first one it does not take"))
    return out


def _tok(tokenizer, token_id: int) -> str:
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    return text.replace("\n", "⏎").replace(" ", "·") or "∅"


def replay_html(side: Side | None, k: int, metric: str = "probability") -> str:
    """Forward `k` (1-based) of `side`'s last generation as an HTML table."""
    if side is None or not side.steps:
        return ('<div class="replay muted" data-steps="0">Generate something first: then step through every '
                'forward of the MARS side here.</div>')
    n = len(side.steps)
    k = min(max(int(k), 1), n)
    step = side.steps[k - 1]
    tok = side.loaded.tokenizer
    B = len(step.proposed)
    before = tok.decode(side.track.ids[:step.start], skip_special_tokens=True)
    tail = ("…" if len(before) > 80 else "") + before[-80:]
    masks = "".join('<span class="mask-chip">[MASK]</span>' for _ in range(B - 1))
    if step.verified is not None:  # exact modes: the forward held drafts and groups of masks
        masks = f'<span class="mask-chip">{step.verified} verified draft(s) + [MASK] group</span>'
    rows = []
    for j, ((mark, why), tid, c) in enumerate(zip(decisions(step, metric, side.cfg.repeat_guard), step.proposed,
                                                           step.confidences)):
        v = step.verified
        if v is None:
            where = "after the last real token" if j == 0 else f"mask {j}"
        else:
            where = f"draft {j + 1}" if j < v else "after the drafts" if j == v else f"mask {j - v}"
        sym = {"accepted": "✓ accepted", "rejected": "✗ rejected", "end": "⏹ end"}[mark]
        rows.append(f'<tr class="pred" data-mark="{mark}"><td>{j + 1}</td><td>{where}</td>'
                    f'<td><code>{html.escape(_tok(tok, tid))}</code></td><td>{c:.3f}</td>'
                    f'<td class="mark">{sym}</td><td>{html.escape(why)}</td></tr>')
    name, op = RULE[metric]
    if step.verified is None:
        what = f"tau {step.tau:g} (accept while {name} {op} tau) · {step.accepted} of {B} predictions committed"
    else:  # exact modes: `proposed` holds the committed tokens only
        what = (f"{step.accepted} token{'s' if step.accepted != 1 else ''} committed: {step.verified} verified "
                f"draft{'s' if step.verified != 1 else ''}, then the model's own prediction"
                + (f" and tokens accepted by tau {step.tau:g}" if step.accepted > step.verified + 1 else ""))
    return (f'<div class="replay" data-steps="{n}" data-step="{k}" data-accepted="{step.accepted}">'
            f'<div class="replay-head"><b>Forward {k} of {n}</b> · {html.escape(what)}</div>'
            f'<div class="replay-in"><span class="lbl">In:</span> <span class="sofar">{html.escape(tail) or "(the prompt)"}'
            f'</span>{masks}</div>'
            f'<table class="replay-table"><caption>Out: {"the B predictions of this forward" if step.verified is None else "the tokens this forward committed"} '
            '<span class="muted">(· is a space, ⏎ a new line)</span></caption>'
            '<thead><tr><th scope="col">#</th><th scope="col">read at</th><th scope="col">prediction</th>'
            '<th scope="col">confidence</th><th scope="col">decision</th><th scope="col">why</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')
