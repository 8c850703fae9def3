"""Planted bugs in the one exact step (issue 52) and the mask gate (issue 51): the window, the
path, the commit, the plans, prompt lookup, the replay of fastest_exact, the gate's rule and the
gated training layout. Read by tests/mutants.py; same form as its MUTANTS."""

SHAPED = "tests/test_exact_step.py tests/test_scripted_exact.py tests/test_tree.py tests/test_lookup.py tests/test_compiled_lossless.py"
TESTS = {
    "mars_core/exact_step.py": SHAPED,
    "mars_core/draft_plan.py": f"tests/test_fastest.py {SHAPED}",
    "mars_core/decode_shaped.py": SHAPED,
    "mars_core/tree.py": f"tests/test_tree.py {SHAPED} tests/test_exact.py",
    "mars_core/lookup.py": "tests/test_lookup.py",
    "mars_core/fastest.py": "tests/test_fastest.py",
    "mars_core/gate.py": "tests/test_gate.py",
    "training/gated_layout.py": "tests/test_gate.py",
    "training/gated_stage.py": "tests/test_gate.py",
}

MUTANTS = [
    # the window and the path
    ("a node sees its siblings", "mars_core/tree.py", "sees_node = is_node[None, :] & self.ancestry[of][:, i.clamp(max=n - 1)]",
     "sees_node = is_node[None, :] & (self.ancestry[of][:, i.clamp(max=n - 1)] | is_node[:, None])"),
    ("a group sees the masks of another", "mars_core/tree.py", "& (g[:, None] == g[None, :]) &", "&"),
    ("group positions one late", "mars_core/tree.py", "self.node_depth[u.clamp(max=n - 1)] + 1 + m)",
     "self.node_depth[u.clamp(max=n - 1)] + 2 + m)"),
    ("the prefix not causal", "mars_core/tree.py", "pattern[:P, :P] = torch.ones(P, P, dtype=torch.bool).tril()",
     "pattern[:P, :P] = True"),
    ("a node accepted without its parent", "mars_core/tree.py", "acc |= (depth == d) & match & acc.gather(1, parent)",
     "acc |= (depth == d) & match"),
    # the step
    ("a padding leaf can be accepted", "mars_core/exact_step.py", "tokens=torch.tensor([list(p.tokens) + [-1] * (N - len(p.tokens)) for p in plans],",
     "tokens=torch.tensor([list(p.tokens) + [pad_id] * (N - len(p.tokens)) for p in plans],"),
    ("max_accept ignored", "mars_core/exact_step.py", "        j = j.clamp(max=max_accept - 1)", "        pass"),
    ("the bonus read at the root", "mars_core/exact_step.py", "    bonus = pred[at, last]", "    bonus = pred[:, 0]"),
    ("confidence of the wrong node", "mars_core/exact_step.py", "before = torch.where(d <= j[:, None], before, last[:, None])",
     "before = torch.where(d < j[:, None], before, last[:, None])"),
    ("next drafts from any group", "mars_core/exact_step.py", "has = match.any(dim=1) & alive & ~done", "has = alive & ~done"),
    ("key/values not moved", "mars_core/exact_step.py", "    move_path(cache, cursor, w, out.path, out.j)\n", ""),
    ("moved one slot late", "mars_core/exact_step.py", "    dst = root[:, None] + 1 + d  # (R, D)", "    dst = root[:, None] + 2 + d  # (R, D)"),
    ("cursor skips the root", "mars_core/exact_step.py", "cursor + torch.where(alive, w.prefix + 1 + out.j, 0)",
     "cursor + torch.where(alive, w.prefix + out.j, 0)"),
    ("group columns one early", "mars_core/exact_step.py", "base + 1 + N + torch.arange(G * M, device=base.device)[None]",
     "base + N + torch.arange(G * M, device=base.device)[None]"),
    # the loop and the plans
    ("padding drafts counted", "mars_core/decode_shaped.py", "rows.stats.drafted += plans[r].shape.size",
     "rows.stats.drafted += max(plans[r].shape.size, 1)"),
    ("the root is the first emitted token", "mars_core/decode_shaped.py", "roots[r] = o.taken[-1:]", "roots[r] = o.taken[:1]"),
    ("a chain's last group after the root", "mars_core/draft_plan.py", "    return (k,)\n", "    return (0,)\n"),
    ("the masks after a copied chain kept", "mars_core/draft_plan.py",
     "            c = Candidates()  # the masks after a copied chain are dropped", "            pass"),
    ("tree ranks shifted", "mars_core/draft_plan.py", "tokens = tuple(c.ids[len(node) - 1][node[-1]] for node in tree.nodes)",
     "tokens = tuple(c.ids[len(node) - 1][max(node[-1] - 1, 0)] for node in tree.nodes)"),
    ("lookup ignores the policy's length", "mars_core/lookup.py", "n, copied = lookup_match(text, self.tokens)",
     "n, copied = lookup_match(text, self.tokens + 1)"),
    ("lookup takes a shorter match", "mars_core/lookup.py", "return (copied, True) if n >= self.min_ngram and copied",
     "return (copied, True) if n >= self.min_ngram - 1 and copied"),
    ("lookup's earliest occurrence", "mars_core/lookup.py", "for start in range(len(text) - n - 1, -1, -1):",
     "for start in range(0, len(text) - n):"),
    # fastest_exact's replay
    ("replay counts no first forward", "mars_core/fastest.py", "    widths = [s.first + 1 + M]  # the first forward", "    widths = []  # the first forward"),
    ("cost curve read at W + 1", "mars_core/fastest.py", "    if width in curve:\n        return curve[width]",
     "    if width + 1 in curve:\n        return curve[width + 1]"),
    # the gate
    ("the gate on everywhere", "mars_core/gate.py", "return torch.where(on[..., None], base_out + d, base_out)", "return base_out + d"),
    ("the mask embedding at real tokens", "mars_core/gate.py",
     "return output if vector is None else gated(output, lambda: vector.to(output.dtype), gate.read())",
     "return output if vector is None else output + vector.to(output.dtype)"),
    ("a stored gate of another rank loads", "mars_core/gate.py", "if a.shape != m.lora_a.shape or b.shape != m.lora_b.shape:",
     "if False:"),
    # the gated training
    ("a group sees the token it predicts", "training/gated_layout.py", "clean = torch.arange(n)[None] <= last_real[:, None]",
     "clean = torch.arange(n)[None] <= last_real[:, None] + 1"),
    ("targets one early", "training/gated_layout.py", "return g._replace(targets=ids[g.source + 1])", "return g._replace(targets=ids[g.source])"),
    ("soft targets from the wrong row", "training/gated_stage.py", "p = base_logp[g.source - (start - 1)]", "p = base_logp[g.source - start]"),
    ("distance weights shifted", "training/gated_stage.py", "w = weights.to(device)[g.distance]", "w = weights.to(device)[g.distance - 1]"),
]
