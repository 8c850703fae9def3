"""What "exact" promises, said per dtype.

In float32 the exact modes (lossless MARS with any drafts, spec at tau 1) emit the model's greedy
AR output token for token: the page says "guaranteed identical". In bfloat16 (the real pair on a
CPU with native bf16) a matmul's rounding depends on its shape: lossless MARS computes each token
in a forward of 1 + drafts positions, AR in a forward of one, so where the model's two best
candidates are closer than bf16 can tell apart (a near-tie) the two runs may take different
branches, each the model's own argmax in its own forward. What the page promises there: every
MARS token is the model's argmax in the forward that verified it, identical to a separate AR run
except at bf16 near-ties; when the two sides differ it measures the tie and says so. The same
holds for float16 and for 8/4-bit weights (their kernels are shape-dependent too).
"""
from __future__ import annotations

import torch

from mars_core.gate import gate_of
from mars_core.packaged import DERIVED
from mars_core.prompts import encode_prompt

from .models import Loaded


def precision(loaded: Loaded) -> str:
    """"float32", or what makes the model's arithmetic shape-dependent (a dtype or a quantization)."""
    if loaded.quantization != "none":
        return f"{loaded.quantization} weights"
    p = next(loaded.model.parameters(), None)
    return str(p.dtype).replace("torch.", "") if p is not None else "float32"


def same_ar_path(mars: Loaded, ar: Loaded | None) -> bool:
    """Does the AR side compute the MARS model's own AR decoding? When it is the same model, or
    the base a mask-gated fine-tune was trained on, in the same precision: every real position of
    the fine-tune computes the base's output (mars_core.gate), so its AR decoding is the base's."""
    if ar is mars:
        return True
    return gated_base(mars, ar) and precision(mars) == precision(ar)


def gated_base(mars: Loaded, ar: Loaded | None) -> bool:
    """Is `ar` the base that `mars`, a mask-gated fine-tune, was trained on (whatever its precision)?"""
    return (ar is not None and gate_of(mars.model) is not None
            and DERIVED.get(mars.source, (None,))[0] == ar.source)


def strict(loaded: Loaded) -> bool:
    """Does an exact mode's output equal a separate greedy AR run's, always (float32)?"""
    return precision(loaded) == "float32"


def agree_label(kind: str) -> str:
    """The agreement line of an exact mode that matched AR in reduced precision `kind`."""
    return (f"✓ identical to AR. In {kind} the guarantee is that every MARS token is the model's own argmax in "
            f"the forward that verified it: a separate AR run computes it in a narrower forward, and {kind} rounds "
            "differently by shape, so the two can part only where the model's top two candidates tie at that "
            "precision (in float32: identical, always).")


@torch.no_grad()
def tie_gap(loaded: Loaded, prompt: str, ar_ids: list[int], mars_ids: list[int]) -> tuple[int, float] | None:
    """(index of the first differing token, the gap between the model's top two logits there), from
    one forward of the prompt and the common prefix; None when the outputs do not differ by token."""
    j = next((k for k, (a, b) in enumerate(zip(ar_ids, mars_ids)) if a != b), None)
    if j is None:
        return None
    ids = encode_prompt(loaded.tokenizer, prompt) + list(ar_ids[:j])
    model = loaded.model
    x = torch.tensor([ids], device=next(model.parameters()).device)
    logits = model(input_ids=x, logits_to_keep=1).logits[0, -1].float()
    top = logits.topk(2).values
    return j, float(top[0] - top[1])


def differ_note(kind: str, gap: tuple[int, float] | None) -> str:
    """Why an exact mode parted from AR in reduced precision `kind`, in one line."""
    at = ""
    if gap is not None:
        j, g = gap
        at = (f" At token {j + 1} the model's top two candidates are {g:.3f} apart in logit (measured in one more "
              f"forward), within {kind}'s rounding: a near-tie.")
    return (f"Both sides run the same {kind} model greedily, and each MARS token is the model's own argmax in the "
            f"forward that verified it; but that forward is wider than AR's one-token forward, and {kind} rounds "
            f"differently by shape.{at} In float32 the outputs are identical.")
