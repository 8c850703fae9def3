"""Planted bugs, one at a time, against the suite: which ones does it catch, and how?

Run from the repository root (minutes; commit first, it works on a clean copy of HEAD):

    python tests/mutants.py [--only NAME_PART] [--files PATH,...] [--tests "tests/a.py tests/b.py"]
                            [--checkout] [--out docs/mutants.json]

Each mutant is one plausible bug (a boundary moved, a step dropped, a wrong index) written as an
exact text edit of one file. The harness applies it to a git worktree of HEAD (the checkout you
work in is never touched), runs the tests with `-x`, and records: killed by an assertion,
killed by an exception (a crash in a helper is a weaker catch), or survived. `--checkout` works
on a copy of the checkout as it is instead (uncommitted work included; git is not touched). The
table of results, and why each survivor left alive is harmless, is in docs/testing.md. The
mutants of the newer code (frozen-layer training, LoRA, the int8 delta, prepack) are in
tests/mutants_newer.py; those of the one exact step, the plans, lookup, fastest_exact and the mask
gate in tests/mutants_exact.py.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mutants_exact
import mutants_newer

ROOT = Path(__file__).resolve().parent.parent
EXACT = "tests/test_scripted_exact.py tests/test_exact.py tests/test_exact_sampling.py tests/test_hub.py"
DECODE = "tests/test_scripted.py tests/test_decoders.py tests/test_cursor.py tests/test_decode_stats.py tests/test_compiled.py"
# per mutated file, the tests that exercise it (fast, independent oracles first: with -x a kill is quick)
TESTS = {
    "mars_core/acceptance.py": f"tests/test_scripted.py tests/test_exact_sampling.py tests/test_decoders.py {EXACT} "
                               "tests/test_serving.py tests/test_compiled.py",
    "mars_core/verify.py": EXACT,
    "mars_core/decode_exact.py": EXACT,
    "mars_core/speculative.py": EXACT,
    "mars_core/decoding.py": f"{DECODE} {EXACT}",
    "mars_core/serving.py": "tests/test_scripted.py tests/test_serving.py tests/test_load.py tests/test_app_under_load.py",
    "mars_core/tau_policy.py": "tests/test_tau_policy.py tests/test_serving.py tests/test_load.py",
    "mars_core/export.py": "tests/test_export.py tests/test_hub.py",
    "benchmarks/load_sim.py": "tests/test_load.py tests/test_app_under_load.py",
    **mutants_newer.TESTS,
    **mutants_exact.TESTS,
}

# (name, file, old text, new text): `old` must occur exactly once in the file
MUTANTS = [
    # acceptance
    ("tau equality rejected", "mars_core/acceptance.py", "conf <= tau if metric == \"entropy\" else conf >= tau",
     "conf <= tau if metric == \"entropy\" else conf > tau"),
    ("entropy equality rejected", "mars_core/acceptance.py", "conf <= tau if metric == \"entropy\" else conf >= tau",
     "conf < tau if metric == \"entropy\" else conf >= tau"),
    ("tau 1 accepts p == 1", "mars_core/acceptance.py", "loose = tau > 0 if metric == \"entropy\" else tau < 1",
     "loose = tau > 0 if metric == \"entropy\" else tau <= 1"),
    ("first prediction not forced", "mars_core/acceptance.py", "    ok[:, 0] = True  # the first prediction is the AR one: always taken\n", ""),
    ("accept a non-prefix (sum, no cumprod)", "mars_core/acceptance.py", "n_accept = ok.long().cumprod(dim=1).sum(dim=1)  # (N,)",
     "n_accept = ok.long().sum(dim=1)  # (N,)"),
    ("max_accept ignored in accept", "mars_core/acceptance.py", "        n_accept = n_accept.clamp(max=max_accept)", "        pass"),
    ("temperature not applied", "mars_core/acceptance.py", "    scaled = logits / temperature\n", "    scaled = logits\n"),
    ("margin is top-1 only", "mars_core/acceptance.py", "return top2[..., 0] - top2[..., 1]", "return top2[..., 0]"),
    # verify
    ("padding drafts verified", "mars_core/verify.py", "ok = (drafts == target[:, :K]) & valid", "ok = drafts == target[:, :K]"),
    ("greedy bonus from p_1", "mars_core/verify.py", "return j, target[rows, j], probs", "return j, target[rows, 0], probs"),
    ("resample from p, not the residual", "mars_core/verify.py", "dist = torch.where(usable[:, None], residual, p_next)", "dist = p_next"),
    ("acceptance ratio inverted", "mars_core/verify.py", "ok = (uniform * q_d < p_d) & valid", "ok = (uniform * p_d < q_d) & valid"),
    ("spec block: bonus not forced", "mars_core/verify.py", "    ok[:, 0] = True\n    n = ok.long()", "    n = ok.long()"),
    ("spec block: max_accept ignored", "mars_core/verify.py", "        n = n.clamp(max=max_accept)", "        pass"),
    ("one draft too many emitted", "mars_core/verify.py", "from_draft = idx < j[:, None]", "from_draft = idx <= j[:, None]"),
    ("emitted count leaves out the drafts", "mars_core/verify.py", "return tokens, conf, j + n_block", "return tokens, conf, n_block"),
    ("draft confidence read one position late", "mars_core/verify.py", "return confidence(probs[:, :K], drafts, metric)",
     "return confidence(probs[:, 1:K + 1], drafts, metric)"),
    # decode_exact
    ("cap keeps max_accept drafts", "mars_core/decode_exact.py", "capped = j.clamp(max=max_accept - 1)", "capped = j.clamp(max=max_accept)"),
    ("cap keeps the old bonus", "mars_core/decode_exact.py", "return capped, torch.where(cut, nxt, bonus)", "return capped, bonus"),
    ("spec cap ignores the drafts", "mars_core/decode_exact.py", "cap = None if cfg.max_accept is None else cfg.max_accept - j",
     "cap = cfg.max_accept"),
    ("group after the previous draft", "mars_core/decode_exact.py", "match = sel == j[:, None]", "match = sel == (j[:, None] - 1).clamp_min(0)"),
    ("spec block without a group not cut", "mars_core/decode_exact.py",
     "            n_block = torch.where(has_group, n_block, torch.ones_like(n_block))\n", ""),
    ("new drafts without a group", "mars_core/decode_exact.py", "if len(o.extra) > 1 and o.extra[1] else []",
     "if len(o.extra) > 1 else []"),
    ("feed drops the AR token", "mars_core/decode_exact.py", "feed = [e[a:] for e, a in zip(emitted, js)]",
     "feed = [e[a + 1:] for e, a in zip(emitted, js)]"),
    ("verified count not cut", "mars_core/decode_exact.py", "event.verified[r] = min(a, len(e))", "event.verified[r] = a"),
    ("accepted drafts counted as drafted", "mars_core/decode_exact.py", "rows.stats.accepted_drafts += sum(js)",
     "rows.stats.accepted_drafts += sum(len(x) for x in drafts)"),
    # speculative
    ("draft rollback keeps unfed drafts", "mars_core/speculative.py", "kept = [min(a, f) for a, f in zip(j, self.fed)]", "kept = list(j)"),
    ("draft never rolled back", "mars_core/speculative.py", "self.ctx.rollback([f - k for f, k in zip(self.fed, kept)])",
     "self.ctx.rollback([0 for f in self.fed])"),
    ("MARS draft keeps by the sampled token's p", "mars_core/speculative.py",
     "ok = passes(probs.max(dim=-1).values, self.tau, \"probability\")",
     "ok = passes(probs.gather(-1, tokens[..., None])[..., 0], self.tau, \"probability\")"),
    ("MARS draft overshoots K", "mars_core/speculative.py", "take = min(int(row[-1]), K - len(drafts[i]))", "take = int(row[-1])"),
    ("draft vocab padded with 0 logits", "mars_core/speculative.py", "pad = logits.new_full(logits.shape[:-1] + (V - Vd,), float(\"-inf\"))",
     "pad = logits.new_full(logits.shape[:-1] + (V - Vd,), 0.0)"),
    ("padded draft vocab refused", "mars_core/speculative.py", "if vd != vt and (vd < n_tok or vt < n_tok):", "if vd != vt:"),
    ("draft thinks every draft was fed", "mars_core/speculative.py", "self.fed = [K - t for t in last]", "self.fed = [K for t in last]"),
    # shared bookkeeping
    ("budget not cut", "mars_core/decoding.py", "take = torch.minimum(first_stop, remaining)", "take = first_stop"),
    ("EOS-only step counts 0", "mars_core/decoding.py", "counts[r] = max(len(o.taken), 1)", "counts[r] = len(o.taken)"),
    ("stop token read one late", "mars_core/decoding.py", "int(row[k]) if k < B else None", "int(row[k + 1]) if k + 1 < B else None"),
    ("stop recorded at the cap", "mars_core/decoding.py", "if o.done and len(o.taken) < self.cfg.max_new_tokens - len(self.out[r]):",
     "if o.done:"),
    ("stop after the EOS", "mars_core/decoding.py", "first_stop = torch.where(hit, stop.float().argmax(dim=1), n_accept)",
     "first_stop = torch.where(hit, stop.float().argmax(dim=1) + 1, n_accept)"),
    # serving
    ("moved row loses its last slot", "mars_core/serving.py", "self.cache.move_row(last, i, self.live[last].cursor)",
     "self.cache.move_row(last, i, self.live[last].cursor - 1)"),
    ("retired row not refilled", "mars_core/serving.py", "                self.cache.move_row(last, i, self.live[last].cursor)\n", ""),
    ("cursor advanced by the new tokens", "mars_core/serving.py", "s.cursor += len(s.feed)", "s.cursor += len(o.taken)"),
    ("one strict row drops every row's masks", "mars_core/serving.py", "strict = all(_strictest(t, self.cfg.metric) for t in taus)",
     "strict = any(_strictest(t, self.cfg.metric) for t in taus)"),
    ("per-request tau ignored", "mars_core/serving.py",
     "taus = [s.request.control.tau if s.request.control is not None else tau for s in self.live]", "taus = [tau for s in self.live]"),
    ("EOS-only step counts 0 (serving)", "mars_core/serving.py", "s.accepted.append(max(len(o.taken), 1))",
     "s.accepted.append(len(o.taken))"),
    ("stopped queued request still starts", "mars_core/serving.py",
     "        self.waiting = deque(s for s in self.waiting if not s.finished)\n", ""),
    ("finished replies not reported", "mars_core/serving.py", "            self._replies.append(len(s.out))\n", ""),
    # tau policy
    ("ladder misses the loose end", "mars_core/tau_policy.py", "return rungs if rungs[-1] == round(loose, 6) else rungs + [round(loose, 6)]",
     "return rungs"),
    ("relax needs pressure above high", "mars_core/tau_policy.py", "if self.pressure >= cfg.high and", "if self.pressure > cfg.high and"),
    ("relax while the queue drains", "mars_core/tau_policy.py", "and backlog >= self.backlog_at_move:", ":"),
    ("patience one short", "mars_core/tau_policy.py", "if self.streak >= cfg.patience or", "if self.streak >= cfg.patience - 1 or"),
    ("cost lookup: nearest smaller batch", "mars_core/tau_policy.py", "seen = sorted(n for n in self.cost[level] if n >= rows)",
     "seen = sorted((n for n in self.cost[level] if n <= rows), reverse=True)"),
    ("cost lookup: largest batch", "mars_core/tau_policy.py", "return statistics.median(self.cost[level][seen[0]]) if seen else None",
     "return statistics.median(self.cost[level][seen[-1]]) if seen else None"),
    ("prediction ignores the stricter rung's cost", "mars_core/tau_policy.py", "step = min(there, here) if there is not None else here",
     "step = here"),
    ("latency window kept across a move", "mars_core/tau_policy.py",
     "            self.recent.clear()  # measured afresh at the new rung (else its lag would overshoot)\n", ""),
    ("strict rung's T/F measured", "mars_core/tau_policy.py", "if self.level > 0:  # the strict rung", "if True:  # the strict rung"),
    ("no queue factor", "mars_core/tau_policy.py", "self.pressure = max(1.0, backlog / slots) * reply", "self.pressure = reply"),
    # export
    ("mask may be the unknown token", "mars_core/export.py", "elif mask_id is None or mask_id == tok.unk_token_id:", "elif mask_id is None:"),
    ("mask row outside the embeddings", "mars_core/export.py",
     "    if mask_id >= rows:\n        raise ValueError(f\"the mask token id {mask_id} is outside", "    if False:\n        raise ValueError(f\"the mask token id {mask_id} is outside"),
    ("no pard_token for vLLM", "mars_core/export.py", "        config_json[\"pard_token\"] = mask_id", "        pass"),
    ("mask id not in the generation defaults", "mars_core/export.py", "\"block_size\": B, \"mask_token_id\": mask_id}", "\"block_size\": B}"),
    # the under-load verdict
    ("verdict ignores a stopped run", "benchmarks/load_sim.py", "(pct(lat, 0.95) <= target and not raw[\"stopped\"])", "(pct(lat, 0.95) <= target)"),
    ("verdict on the median", "benchmarks/load_sim.py", "(pct(lat, 0.95) <= target and", "(pct(lat, 0.5) <= target and"),
    *mutants_newer.MUTANTS,
    *mutants_exact.MUTANTS,
]


def worktree() -> Path:
    path = Path(tempfile.mkdtemp(prefix="mars-mutants-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), "HEAD"], cwd=ROOT, check=True,
                   capture_output=True)
    return path


def checkout_copy() -> Path:
    """A copy of the checkout as it is: tracked files and the new ones git does not ignore."""
    path = Path(tempfile.mkdtemp(prefix="mars-mutants-")) / "tree"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():  # a tracked file deleted in the checkout stays deleted
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, path / rel)
    return path


def run_one(tree: Path, name: str, rel: str, old: str, new: str, tests: str, timeout: int) -> dict:
    path = tree / rel
    text = path.read_text(encoding="utf-8")
    if text.count(old) != 1:
        return {"name": name, "file": rel, "result": "not applied", "detail": f"found {text.count(old)} times"}
    path.write_text(text.replace(old, new), encoding="utf-8")
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rfE", "--tb=no",
                               *tests.split()], cwd=tree, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1", COLUMNS="400"))
        out = proc.stdout + proc.stderr
        code = proc.returncode
    except subprocess.TimeoutExpired:
        out, code = "timeout", -1
    finally:
        path.write_text(text, encoding="utf-8")
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)(?: - (\w+))?", out, re.M)  # ERROR: a fixture failed
    if code == 0:
        result, detail = "survived", ""
    elif failed:
        kind = failed.group(2) or ""
        assertion = kind in ("AssertionError", "Failed", "") or kind.startswith("assert") or "assert".startswith(kind)
        result = "killed (assertion)" if assertion else f"killed ({kind})"
        detail = failed.group(1)
    else:
        result, detail = ("timeout" if code == -1 else "error"), out.strip().splitlines()[-1] if out.strip() else ""
    return {"name": name, "file": rel, "result": result, "detail": detail, "seconds": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="run the mutants whose name contains one of these (comma-separated)")
    ap.add_argument("--tests", default=None, help="test files to run (default: per mutated file)")
    ap.add_argument("--files", default=None, help="run the mutants of these files (comma-separated paths)")
    ap.add_argument("--checkout", action="store_true", help="mutate a copy of the checkout as it is, not HEAD")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    tree = checkout_copy() if args.checkout else worktree()
    results = []
    try:
        for name, rel, old, new in MUTANTS:
            if args.only and not any(part in name for part in args.only.split(",")):
                continue
            if args.files and rel not in args.files.split(","):
                continue
            r = run_one(tree, name, rel, old, new, args.tests or TESTS[rel], args.timeout)
            results.append(r)
            print(f"{r['result']:<22} {rel:<28} {name}  {r.get('detail', '')}", flush=True)
    finally:
        if args.checkout:
            shutil.rmtree(tree.parent, ignore_errors=True)
        else:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    killed = sum(r["result"].startswith("killed") for r in results)
    asserted = sum(r["result"] == "killed (assertion)" for r in results)
    print(f"{killed}/{len(results)} killed, {asserted} by an assertion")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
