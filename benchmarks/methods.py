"""The benchmark's methods: what each row of the table runs, in one registry.

Adding a method is one `register(...)` call at the bottom of this file (or in a module imported
before the CLI parses its arguments): a `Method` template names the model it runs on ("ar" or
"mars"), the runner that decodes one chunk of prompts, and how the measurement treats it
(optional, AR-with-KV-cache baseline, token reference). `register_family` adds a parametrised
name such as `mars-block-<N>`.

A runner is `run(method, model, tok, ids, tau, args, counter) -> (token ids per prompt, row
forwards)`: it decodes the chunk `ids` (prompt ids, one list per prompt) greedily for at most
`args.max_new_tokens` tokens, cuts every row at its first stop token (EOS excluded), and counts
the forwards each row took part in (the paper's tokens-per-forward denominator).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from mars_core.config import DecodeConfig
from mars_core.decoding import left_pad
from mars_core.generate import decode_steps
from mars_core.loading import load_model
from mars_core.prompts import special_ids

Runner = Callable[..., tuple[list[list[int]], int]]


@dataclass
class Method:
    name: str
    model: str  # "ar" or "mars": which of the two models it decodes with
    run: Runner
    cache: str | None = None
    cache_block_size: int | None = None
    uses_tau: bool = False  # one row per --taus value
    optional: bool = False  # an HF feature that may not work everywhere: a failure is reported, not fatal
    warm_every_chunk: bool = False  # warm up on every chunk (compile: every shape before the clock runs)
    compile: bool = False  # our static-shape cursor path under torch.compile (`DecodeConfig.compile`)
    baseline: bool = False  # an AR-with-KV-cache row: speed-up is over the fastest of these
    reference: bool = False  # the token reference of its model (per tau for MARS)
    exact: bool = False  # output must equal its model's AR reference at any tau (lossless, spec)
    note: Callable[[object], str | None] | None = None  # a note for the report, given the CLI args
    help: str = ""
    state: dict = field(default_factory=dict)  # e.g. {"error": "..."} once it has failed


@dataclass(frozen=True)
class _Family:
    name: str  # the name --methods accepts for the whole family
    expand: Callable[[str, tuple[int, ...]], list[Method] | None]  # None: the name is not ours
    syntax: tuple[str, ...]  # the names shown in the "unknown method" error
    help: str  # shown in --methods' help
    doc: str  # shown in the method list of --help


_REGISTRY: dict[str, Method | _Family] = {}  # insertion order is the table's order


def register(method: Method) -> Method:
    """Add a method template; `method_list` hands out fresh copies of it."""
    if method.name in _REGISTRY:
        raise ValueError(f"method {method.name!r} is registered twice")
    _REGISTRY[method.name] = method
    return method


def register_family(name: str, expand, syntax: tuple[str, ...], help: str, doc: str) -> None:
    """Add a parametrised family: `expand(requested_name, cache_block_sizes)` returns its methods."""
    if name in _REGISTRY:
        raise ValueError(f"method {name!r} is registered twice")
    _REGISTRY[name] = _Family(name, expand, syntax, help, doc)


def fixed_methods() -> tuple[str, ...]:
    """Names of the single (non-family) methods, in registry order."""
    return tuple(n for n, e in _REGISTRY.items() if isinstance(e, Method))


def default_methods() -> list[str]:
    """Every registered name: what the benchmark runs without --methods."""
    return list(_REGISTRY)


def ar_baselines() -> tuple[str, ...]:
    return tuple(n for n, e in _REGISTRY.items() if isinstance(e, Method) and e.baseline)


def methods_help() -> str:
    """The --methods help: every accepted name."""
    fams = [e.help for e in _REGISTRY.values() if isinstance(e, _Family)]
    return "comma-separated subset of: " + ", ".join(fixed_methods() + tuple(fams)) + " (default: all)"


def methods_doc() -> str:
    """One line per method, for --help."""
    lines = []
    for name, e in _REGISTRY.items():
        for k, text in enumerate(e.help.splitlines() if isinstance(e, Method) else e.doc.splitlines()):
            lines.append(f"  {name if k == 0 else '':<21}{text}")
    return "\n".join(lines)


def method_list(names: list[str], cache_block_sizes: tuple[int, ...]) -> list[Method]:
    """Fresh `Method`s for the requested names, in the order asked."""
    out = []
    for name in names:
        entry = _REGISTRY.get(name)
        if isinstance(entry, Method):
            out.append(dataclasses.replace(entry, state={}))
            continue
        for fam in (e for e in _REGISTRY.values() if isinstance(e, _Family)):
            got = fam.expand(name, cache_block_sizes)
            if got is not None:
                out += got
                break
        else:
            syntax = [s for e in _REGISTRY.values() if isinstance(e, _Family) for s in e.syntax]
            raise ValueError(f"unknown method {name!r}; allowed: {', '.join(fixed_methods() + tuple(syntax))}")
    return out


# ---------------------------------------------------------------------------------------------
# runners: one chunk of prompts
# ---------------------------------------------------------------------------------------------


class CallCounter:
    """Counts the model's forward calls (prefill included) with a forward pre-hook.

    With `hook=False` the runner counts for it (`add`): a hook inside a compiled graph would be
    traced into it, and a new counter per run would make dynamo recompile every run.
    """

    def __init__(self, model, hook: bool = True):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self._hook) if hook else None

    def _hook(self, *_):
        self.n += 1

    def add(self, calls: int) -> None:
        if self.handle is None:
            self.n += calls

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()


def _cut(ids: list[int], stop: set[int]) -> tuple[list[int], bool]:
    for j, t in enumerate(ids):
        if t in stop:
            return ids[:j], True
    return ids, False


def _hf_batch(model, ids: list[list[int]], pad_id: int, stop: list[int], max_new: int, **kw):
    """HF generate on a left-padded batch; returns per-row ids (EOS cut) and row forwards."""
    x, valid = left_pad(ids, pad_id, next(model.parameters()).device)  # (N, L), (N, L)
    out = model.generate(x, attention_mask=valid.long(), do_sample=False, max_new_tokens=max_new,
                         pad_token_id=pad_id, eos_token_id=stop, **kw)[:, x.shape[1]:].tolist()
    tokens, row_forwards = [], 0
    for row in out:
        got, hit = _cut(row, set(stop))
        tokens.append(got)
        row_forwards += len(got) + int(hit)  # greedy AR: one token (or the EOS) per forward
    return tokens, row_forwards


def run_hf(method: Method, model, tok, ids, tau, args, counter):
    _, pad_id, stop = special_ids(model, tok)
    return _hf_batch(model, ids, pad_id, stop, args.max_new_tokens)


def run_hf_lookup(method: Method, model, tok, ids, tau, args, counter):
    """HF assisted generation runs at batch 1 only: the chunk's prompts one after the other."""
    _, pad_id, stop = special_ids(model, tok)
    tokens, row_forwards = [], 0
    for seq in ids:
        before = counter.n
        got, _ = _hf_batch(model, [seq], pad_id, stop, args.max_new_tokens,
                           prompt_lookup_num_tokens=args.prompt_lookup_tokens)
        tokens += got
        row_forwards += counter.n - before
    return tokens, row_forwards


def run_hf_compile(method: Method, model, tok, ids, tau, args, counter):
    from transformers import CompileConfig

    _, pad_id, stop = special_ids(model, tok)
    if "compile_config" not in method.state:
        cc = CompileConfig(fullgraph=False, dynamic=None, mode="default")
        cc._compile_all_devices = True  # HF auto-compiles on accelerators only; we want the CPU too
        method.state["compile_config"] = cc
    return _hf_batch(model, ids, pad_id, stop, args.max_new_tokens, cache_implementation="static",
                     compile_config=method.state["compile_config"])


def run_ours(method: Method, model, tok, ids, tau, args, counter):
    """Our decoders through `mars_core.decode_steps`, with the method's cache mode."""
    mode = "ar" if method.model == "ar" else "mars"
    cfg = DecodeConfig(mode=mode, tau=tau if mode == "mars" else 1.0, block_size=args.block_size,
                       cache=method.cache, cache_block_size=method.cache_block_size or 16,
                       metric=args.metric, max_new_tokens=args.max_new_tokens, compile=method.compile)
    rows, steps = decode_steps(model, tok, ids, cfg)
    for _ in steps:
        pass
    counter.add(rows.stats.forwards + rows.stats.prefill_forwards)
    return rows.out, rows.stats.row_forwards


def run_unpacked(method: Method, model, tok, ids, tau, args, counter):
    """`run_ours` on a copy of the model loaded without --prepack: its own nn.Linear layers,
    which inductor packs itself under TORCHINDUCTOR_FREEZING=1 (for MKL, on x86 float32)."""
    if "model" not in method.state:
        path = args.ar_model if method.model == "ar" else args.mars_model
        method.state["model"] = load_model(path, device=args.device, dtype=getattr(torch, args.dtype))[0]
    return run_ours(method, method.state["model"], tok, ids, tau, args, counter)


# ---------------------------------------------------------------------------------------------
# the registry (its order is the table's order)
# ---------------------------------------------------------------------------------------------


def _lookup_note(args) -> str | None:
    if max(args.batch_sizes) > 1:
        return ("hf-prompt-lookup: HF assisted generation supports batch size 1 only; at batch > 1 the "
                "prompts of a batch are decoded one after the other.")
    return None


def _mars_block(c: int) -> Method:
    return Method(f"mars-block-{c}", "mars", run_ours, "block", c, uses_tau=True)


def _expand_mars_block(name: str, cache_block_sizes: tuple[int, ...]) -> list[Method] | None:
    if name == "mars-block":
        return [_mars_block(c) for c in cache_block_sizes]
    if name.startswith("mars-block-") and name[len("mars-block-"):].isdigit():
        return [_mars_block(int(name[len("mars-block-"):]))]
    return None


register(Method("hf-generate", "ar", run_hf, baseline=True, reference=True,
                help='`model.generate(do_sample=False)`, HF\'s dynamic KV cache (what users know)'))
register(Method("ar", "ar", run_ours, "sliding", baseline=True,
                help='our AR decoder (`mode="ar"`, sliding KV cache)'))
register(Method("ar-cursor", "ar", run_ours, "cursor", baseline=True,
                help="our AR decoder with the cursor KV cache"))
register(Method("hf-prompt-lookup", "ar", run_hf_lookup, optional=True, note=_lookup_note,
                help="`model.generate(prompt_lookup_num_tokens=K)`; HF runs it at batch 1 only,\n"
                     "so a batch is decoded one prompt after the other"))
register(Method("ar-static-compile", "ar", run_hf_compile, optional=True, warm_every_chunk=True, baseline=True,
                help='`model.generate(cache_implementation="static")` + `torch.compile`;\n'
                     'reported as "not available" (with the reason) where it fails'))
register(Method("ar-compiled", "ar", run_ours, "cursor", warm_every_chunk=True, compile=True, baseline=True,
                help='our AR decoder on the static-shape cursor cache under `torch.compile`\n'
                     '(`compile=True`; CUDA graphs on a GPU)'))
register(Method("ar-compiled-unpacked", "ar", run_unpacked, "cursor", warm_every_chunk=True, compile=True,
                baseline=True, optional=True,
                help="ar-compiled on the model's own linear layers even under --prepack (with\n"
                     "TORCHINDUCTOR_FREEZING=1 inductor then packs them itself): the strongest\n"
                     "compiled AR of either kind of kernel, in the same run"))
register(Method("mars-nocache", "mars", run_ours, "none", uses_tau=True, reference=True,
                help="MARS, no KV cache (full recompute each step)"))
register(Method("mars-sliding", "mars", run_ours, "sliding", uses_tau=True,
                help="MARS, sliding KV cache"))
register_family("mars-block", _expand_mars_block, ("mars-block", "mars-block-<N>"),
                help="mars-block (all --cache-block-sizes), mars-block-<N>",
                doc="MARS, the paper's block-level cache, one row per --cache-block-sizes\n"
                    "value (mars-block-<N>: cache block size N)")
register(Method("mars-cursor", "mars", run_ours, "cursor", uses_tau=True,
                help="MARS, the cursor KV cache (no block synchronisation)"))
register(Method("mars-compiled", "mars", run_ours, "cursor", uses_tau=True, warm_every_chunk=True, compile=True,
                help="MARS on the static-shape cursor cache under `torch.compile` (`compile=True`)"))
