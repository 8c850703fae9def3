"""The mask gate: trainable weights that act only where the input token is the mask.

A mask-gated MARS fine-tune leaves the base model's weights as they are and adds, to chosen
linear layers, a low-rank delta B @ A (and to the embedding output one vector) that is applied
at the positions whose input id is the mask token and nowhere else:

    position:  t   t   t   t | M   M   M        t = a real token, M = the mask token
    layer y =  Wx  Wx  Wx  Wx| Wx+BAx ...       (every layer that carries an adapter)

A real token's query only ever attends real tokens (causal prefix; in MARS the masks come after
the tokens they continue, and an accepted draft is re-fed as a real token), so every real
position computes exactly what the base computes: the fine-tune's AR output *is* the base's, tau = 1
is the base, and lossless MARS reproduces the base's greedy output. This is the idea of "Your LLM
knows the future" (arXiv 2507.11851): adapters active only on mask positions.

`gated` is the rule, in one place; `GatedLinear` applies it to a linear layer and `attach_gate`
wires a model: a pre-hook on the input embedding reads each forward's ids and sets the gate
(`MaskGate.on`, (B, T) bool) that every wrapped layer of that forward reads. The gate follows the
ids, not the caller, so every decoder, `generate` and a compiled forward carry it unchanged.
A forward given `inputs_embeds` instead of ids has no ids to gate on and is refused.

The stored form (`gate.safetensors`, `save_gate` / `read_gate`): per wrapped weight KEY,
`KEY.lora_a` (r, in) and `KEY.lora_b` (out, r) with the scale folded into B, plus
`mask_embedding` (H,), and metadata naming the mask token id; with `bits=4` the adapters are stored
in 4 bits (metadata `gate_storage`, `mars_core.gate_quant`) and read back as float32.
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from .gate_quant import STORAGE, pack_state, unpack_state

GATE_FILE = "gate.safetensors"
MATRICES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
EMBEDDING = "mask_embedding"


def gated(base_out: torch.Tensor, delta, on: torch.Tensor | bool) -> torch.Tensor:
    """THE rule: `base_out + delta` where the input is the mask (`on`, shape base_out.shape[:-1]),
    `base_out` itself elsewhere, bit for bit (a select, not an addition of zero). `delta` may be a
    function of nothing, computed only when needed; `on` may be a bool when the caller knows that
    every position, or none, holds the mask (the gated training's clean and mask passes)."""
    if on is False:
        return base_out
    d = delta() if callable(delta) else delta
    if on is True:
        return base_out + d
    return torch.where(on[..., None], base_out + d, base_out)


class MaskGate:
    """What one model's wrapped layers share: the mask id and the current forward's gate."""

    def __init__(self, mask_id: int, delta_dtype: torch.dtype | None = None):
        self.mask_id = int(mask_id)
        # the adapters' arithmetic: None is the input's dtype (training: bf16 for its large batches);
        # `install_gate` picks float32 for a half-precision model on a CPU, where a bf16 matmul of a
        # few rows by rank 16 costs ~20 us a call against ~2-5 us in fp32 (oneDNN's per-call set-up;
        # docs/exact-step.md): with 420 of them a forward, the gate was about a fifth of a compiled forward
        self.delta_dtype = delta_dtype
        self.on: torch.Tensor | None = None  # (B, T) bool, set from the ids of each forward
        self.known: bool | None = None  # set by `every`: the input is all masks (True) or none (False)

    @contextlib.contextmanager
    def every(self, masks: bool):
        """Within this block the caller promises that every input token is the mask (True) or
        none is (False), checked once per forward: the layers then skip the per-position select
        (and, for False, the adapters). The gated training's two passes are such forwards."""
        self.known = masks
        try:
            yield
        finally:
            self.known = None

    def read(self) -> torch.Tensor | bool:
        if self.known is not None:
            return self.known
        if self.on is None:
            raise RuntimeError("a mask-gated layer ran outside a forward of the model (the gate is set from "
                               "the input ids at the embedding)")
        return self.on


class GatedLinear(nn.Module):
    """A linear layer plus B @ A, the delta applied where the gate is on (`gated`)."""

    def __init__(self, base: nn.Module, rank: int, gate: MaskGate, trainable: bool = False,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if rank < 1:
            raise ValueError(f"adapter rank must be >= 1, got {rank}")
        self.base, self.gate = base, gate
        weight = base.weight
        out_features, in_features = weight.shape
        dtype = dtype or weight.dtype  # training keeps fp32 adapters beside a bf16 base
        self.lora_a = nn.Parameter(torch.empty(rank, in_features, dtype=dtype, device=weight.device),
                                   requires_grad=trainable)  # (r, in)
        self.lora_b = nn.Parameter(torch.zeros(out_features, rank, dtype=dtype, device=weight.device),
                                   requires_grad=trainable)  # (out, r); zero: starts as the base
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.siblings: Siblings | None = None  # set by `fuse_siblings` (an installed, frozen gate)
        self.sibling_index = 0

    @property
    def weight(self) -> torch.Tensor:  # code that reads a projection's weight (dtype, shape) still works
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated(self.base(x), lambda: self.delta(x), self.gate.read())

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """B @ A x (..., out), in the gate's `delta_dtype`, returned in x's dtype."""
        if self.siblings is not None:
            return self.siblings.delta(self.sibling_index, x)
        dt = self.gate.delta_dtype or x.dtype
        return ((x.to(dt) @ self.lora_a.T.to(dt)) @ self.lora_b.T.to(dt)).to(x.dtype)


class Siblings:
    """The adapters of layers that read one input (q, k, v; gate, up) as two matmuls for all:
    A stacked (sum r, in) and B block-diagonal (sum out, sum r); each layer takes its columns.

    Why: on a CPU every matmul call has a fixed set-up cost that dwarfs a few rows by rank 16;
    a forward of the 30-layer model made 420 of them, about a quarter of a compiled window step's
    time (docs/exact-step.md). Stacking siblings makes 240. Only mask positions read
    the result (`gated`), so its rounding (the block-diagonal's zeros) touches drafts, never the
    base's tokens. The first sibling to see an input computes every sibling's delta; the others
    take theirs while the input is the same tensor, and the last one clears the stash, so no
    tensor outlives the forward (a compiled graph would otherwise guard on it)."""

    def __init__(self, layers: list[GatedLinear]):
        self.gate, self.size = layers[0].gate, len(layers)
        with torch.no_grad():
            self.a = torch.cat([m.lora_a for m in layers])  # (sum r, in)
            self.b = torch.block_diag(*[m.lora_b for m in layers])  # (sum out, sum r)
        ends = torch.tensor([m.lora_b.shape[0] for m in layers]).cumsum(0).tolist()
        self.cols = list(zip([0] + ends[:-1], ends))  # each layer's columns of the stacked output
        self.x: torch.Tensor | None = None
        self.out: torch.Tensor | None = None
        self.left = 0

    def delta(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Sibling i's B @ A x, the same formula as an unfused layer's (`GatedLinear.delta`)."""
        if self.x is not x:
            dt = self.gate.delta_dtype or x.dtype
            a, b = self.a.to(x.device, dt), self.b.to(x.device, dt)
            self.x, self.left = x, self.size
            self.out = ((x.to(dt) @ a.T) @ b.T).to(x.dtype)  # (..., sum out)
        start, end = self.cols[i]
        out = self.out[..., start:end]
        self.left -= 1
        if self.left == 0:
            self.x = self.out = None
        return out


SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fuse_siblings(model) -> int:
    """Give each group of `SIBLINGS` the model's wrapped layers hold its stacked adapters (a
    frozen gate: made from the adapters' current values, so call it again after changing them).
    Returns the number of groups."""
    n = 0
    for module in model.modules():
        for names in SIBLINGS:
            layers = [m for m in (getattr(module, name, None) for name in names) if isinstance(m, GatedLinear)]
            if len(layers) > 1:  # a gate on some of them (q and v, say) stacks those
                group = Siblings(layers)
                for i, m in enumerate(layers):
                    m.siblings, m.sibling_index = group, i
                n += 1
    return n


def _set_gate(gate: MaskGate, embedding: nn.Module):
    def pre_hook(module, args, kwargs):
        ids = args[0] if args else kwargs.get("input")
        on = ids == gate.mask_id  # (B, T)
        if gate.known is not None:
            # checked eagerly; a compiled graph traced inside the promise trusts it (reading the ids
            # there would be a data-dependent branch), and its guard on `known` keeps it to the promise
            if not torch.compiler.is_compiling() and bool(on.all() if gate.known else on.any()) != gate.known:
                raise ValueError(f"the gate was promised {'only' if gate.known else 'no'} mask tokens in this input")
        elif on.device.type == "cpu" and not torch.compiler.is_compiling() and not bool(on.any()):
            # no mask in this forward (an AR step, a prompt): every layer is the base's own, and its
            # adapters are not run at all (~1.2x the base's one-token cost in eager bf16 otherwise).
            # Decided inside the forward, so no state outlives it; on a CPU only, where reading the ids
            # is no device sync (a decode step keeps to one); compiled graphs keep the select.
            on = False
        gate.on = on

    def post_hook(module, args, output):
        vector = getattr(embedding, EMBEDDING, None)
        return output if vector is None else gated(output, lambda: vector.to(output.dtype), gate.read())

    return pre_hook, post_hook


def _refuse_embeds(model):
    def pre_hook(module, args, kwargs):
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError("a mask-gated model gates on the input ids: call it with input_ids, not inputs_embeds")
    return pre_hook


def wrapped_layers(model) -> dict[str, GatedLinear]:
    """{weight key in the unwrapped model: its GatedLinear}."""
    return {name + ".weight": m for name, m in model.named_modules() if isinstance(m, GatedLinear)}


def gate_of(model) -> MaskGate | None:
    return getattr(model, "mars_gate", None)


def no_masks(model):
    """A block in which the caller promises that no input of `model` holds the mask (an AR decode):
    a gated model's layers are the base's alone, eager or compiled. A compiled graph keeps the
    per-position select otherwise, since it cannot branch on the ids (`_set_gate`). Enter it per
    forward: the promise is the model's state, which a forward of another thread would read."""
    gate = gate_of(model)
    return gate.every(False) if gate is not None else contextlib.nullcontext()


def attach_gate(model, mask_id: int, rank: int, layers: int | None = None, trainable: bool = False,
                matrices: tuple[str, ...] = MATRICES, dtype: torch.dtype | None = None,
                delta_dtype: torch.dtype | None = None) -> list[nn.Parameter]:
    """Wrap `matrices` of the top `layers` decoder layers (all when None) and the mask's input
    embedding with gated adapters (B = 0, embedding delta 0: the model is still the base).
    Returns the new parameters (trainable when asked; everything else is left as it was), in
    `dtype` (default: the model's); `delta_dtype`: the dtype the adapters compute in (`MaskGate`)."""
    if gate_of(model) is not None:
        raise ValueError("this model already carries a mask gate")
    decoder = model.model.layers
    n = len(decoder) if layers is None else layers
    if not 1 <= n <= len(decoder):
        raise ValueError(f"gated layers must be 1..{len(decoder)}, got {layers}")
    unknown = set(matrices) - set(MATRICES)
    if unknown:
        raise ValueError(f"unknown matrices {sorted(unknown)}; known: {', '.join(MATRICES)}")
    gate = MaskGate(mask_id, delta_dtype)
    embedding = model.get_input_embeddings()
    dtype = dtype or embedding.weight.dtype  # not a quantised layer's storage dtype
    params = []
    for layer in decoder[len(decoder) - n:]:
        for block in (layer.self_attn, layer.mlp):
            for name in matrices:
                if hasattr(block, name):
                    wrapped = GatedLinear(getattr(block, name), rank, gate, trainable, dtype)
                    setattr(block, name, wrapped)
                    params += [wrapped.lora_a, wrapped.lora_b]
    weight = embedding.weight
    vector = nn.Parameter(torch.zeros(weight.shape[1], dtype=dtype or weight.dtype, device=weight.device),
                          requires_grad=trainable)
    embedding.register_parameter(EMBEDDING, vector)
    params.append(vector)
    pre, post = _set_gate(gate, embedding)
    embedding.register_forward_pre_hook(pre, with_kwargs=True)
    embedding.register_forward_hook(post)
    model.register_forward_pre_hook(_refuse_embeds(model), with_kwargs=True)
    model.mars_gate = gate
    return params


def gate_state(model) -> dict[str, torch.Tensor]:
    """The adapters alone in the stored form (the scale folded into B, which it already is here)."""
    out = {}
    for key, m in wrapped_layers(model).items():
        out[key + ".lora_a"] = m.lora_a.detach().clone()
        out[key + ".lora_b"] = m.lora_b.detach().clone()
    out[EMBEDDING] = getattr(model.get_input_embeddings(), EMBEDDING).detach().clone()
    return out


def load_gate_state(model, state: dict[str, torch.Tensor]) -> None:
    """Put `gate_state`'s tensors into a model that `attach_gate` wrapped the same way."""
    wrapped = wrapped_layers(model)
    keys = {k.rsplit(".", 1)[0] for k in state if k != EMBEDDING}
    if keys != set(wrapped) or EMBEDDING not in state:
        missing, extra = sorted(set(wrapped) - keys)[:2], sorted(keys - set(wrapped))[:2]
        raise ValueError(f"the stored gate does not match this model's wrapped layers (missing {missing}, extra {extra})")
    with torch.no_grad():
        for key, m in wrapped.items():
            a, b = state[key + ".lora_a"], state[key + ".lora_b"]
            if a.shape != m.lora_a.shape or b.shape != m.lora_b.shape:
                raise ValueError(f"stored adapter {key} has shapes {tuple(a.shape)} / {tuple(b.shape)}, "
                                 f"the model's {tuple(m.lora_a.shape)} / {tuple(m.lora_b.shape)}")
            m.lora_a.copy_(a)
            m.lora_b.copy_(b)
        getattr(model.get_input_embeddings(), EMBEDDING).copy_(state[EMBEDDING])
    if any(m.siblings is not None for m in wrapped.values()):
        fuse_siblings(model)  # the stacked copies follow the new values


def describe(state: dict[str, torch.Tensor]) -> tuple[int, int, tuple[str, ...]]:
    """(rank, layers, matrices) of a stored gate, read from its keys."""
    keys = [k for k in state if k.endswith(".lora_a")]
    if not keys:
        raise ValueError("the stored gate holds no adapters")
    layer_ids = {int(k.split(".")[2]) for k in keys}
    matrices = tuple(m for m in MATRICES if any(f".{m}." in k for k in keys))
    return int(state[keys[0]].shape[0]), len(layer_ids), matrices


def save_gate(model, path: str, dtype: torch.dtype = torch.bfloat16, bits: int | None = None) -> None:
    """Write the gate (bf16 by default: a rank-16 gate on every layer of a 135M model is ~10 MB;
    `bits=4`: its adapters in 4 bits, ~2.9 MB, the mask embedding still in `dtype`)."""
    import os

    from safetensors.torch import save_file

    if bits not in (None, 4):
        raise ValueError(f"bits={bits!r}: a gate is stored in `dtype` (bits=None) or in 4 bits (bits=4)")
    state = gate_state(model)
    meta = {"format": "pt", "mask_token_id": str(gate_of(model).mask_id)}
    if bits == 4:
        embedding = state.pop(EMBEDDING)
        state = {**pack_state(state, dtype), EMBEDDING: embedding.to(dtype).contiguous()}
        meta["gate_storage"] = STORAGE
    else:
        state = {k: v.to(dtype).contiguous() for k, v in state.items()}
    tmp = path + ".tmp"
    save_file(state, tmp, metadata=meta)
    os.chmod(tmp, 0o644)  # an ordinary file of the checkout, readable like the rest
    os.replace(tmp, path)


def read_gate(path: str) -> tuple[dict[str, torch.Tensor], int]:
    """(state, mask id) of a stored gate, in either stored form."""
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}
    if "mask_token_id" not in meta:
        raise ValueError(f"{path} does not name its mask token (metadata mask_token_id): not a mask gate")
    storage = meta.get("gate_storage")
    if storage not in (None, STORAGE):
        raise ValueError(f"{path} stores its gate as {storage!r}; this version reads plain tensors or {STORAGE!r}")
    return (unpack_state(state) if storage else state), int(meta["mask_token_id"])


def install_gate(model, state: dict[str, torch.Tensor], mask_id: int) -> None:
    """Attach a gate shaped as `state` says and fill it (frozen, on the model's device; in the
    model's dtype, or float32 for a half-precision model on a CPU: `MaskGate.delta_dtype`)."""
    rank, layers, matrices = describe(state)
    weight = model.get_input_embeddings().weight
    wide = torch.float32 if weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float16) else None
    attach_gate(model, mask_id, rank, layers, trainable=False, matrices=matrices, dtype=wide, delta_dtype=wide)
    load_gate_state(model, state)
    fuse_siblings(model)


def load_gate(model, path: str) -> None:
    """Attach and fill a stored gate."""
    install_gate(model, *read_gate(path))


def ensure_gate(model, source: str | None = None) -> bool:
    """Attach the gate of a mask-gated checkpoint to a model loaded without it (a stock
    `from_pretrained`, which reads model.safetensors only: the base). `source`: the folder or hub
    id holding `gate.safetensors` (default: the model's `name_or_path`). Returns whether the model
    carries a gate now."""
    if gate_of(model) is not None:
        return True
    import os

    source = source or getattr(model.config, "name_or_path", None)
    if not source:
        return False
    path = os.path.join(os.path.expanduser(source), GATE_FILE)
    if not os.path.isfile(path):
        if os.path.exists(os.path.expanduser(source)):
            return False
        try:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(source, GATE_FILE)
        except Exception as e:  # noqa: BLE001 - offline, no such file: the caller says what it needs
            raise ValueError(f"this checkpoint is mask-gated but its {GATE_FILE} could not be read from "
                             f"{source!r}: {type(e).__name__}: {e}") from None
    p = next(model.parameters())
    load_gate(model, path)
    model.to(p.device)
    return True
