"""The power of tests/test_exact_sampling.py's chi-square test against deliberate bugs in verify_drafts,
patched in this process only (the file on disk never changes). Run from tests/: PYTHONPATH=..:. python power_bugs.py
Prints the rows of the table in docs/lossless.md."""
import inspect, textwrap
import mars_core.verify as V
import mars_core.decode_exact as DE
import test_exact_sampling as T
from mars_core import DecodeConfig

SRC = textwrap.dedent(inspect.getsource(V.verify_drafts))
BUGS = {
    "none (the shipped code)": None,
    "on rejection resample from p, not max(0, p - q)": ("dist = torch.where(usable[:, None], residual, p_next)", "dist = p_next"),
    "accept with probability min(1, q/p) (ratio inverted)": ("ok = (uniform * q_d < p_d) & valid", "ok = (uniform * p_d < q_d) & valid"),
    "accept 10% too often (min(1, 1.1 p/q))": ("ok = (uniform * q_d < p_d) & valid", "ok = (uniform * q_d < 1.1 * p_d) & valid"),
    "accept 3% too often (min(1, 1.03 p/q))": ("ok = (uniform * q_d < p_d) & valid", "ok = (uniform * q_d < 1.03 * p_d) & valid"),
    "accept every draft (no verification)": ("ok = (uniform * q_d < p_d) & valid", "ok = valid"),
}
target = T.tiny_model(0, 4.0)
drafter = T.tiny_model(5, 4.0)
for case in ("lossless", "spec-ar-draft"):
    kw, uses_draft = T.CASES[case]
    cfg = DecodeConfig(cache="cursor", max_new_tokens=T.LENGTH, **kw)
    exact = T.exact_ar(target, cfg.temperature)
    for name, edit in BUGS.items():
        src = SRC if edit is None else SRC.replace(*edit)
        assert edit is None or src != SRC
        ns = dict(V.__dict__)
        exec(src, ns)
        DE.verify_drafts = ns["verify_drafts"]
        samples = T.sample(target, cfg, drafter if uses_draft else None)
        st = T.sample.stats
        stat, df, p = T.chi_square(samples, exact)
        print(f"| {case} | {name} | {st.accepted_drafts / st.drafted:.2f} | {stat:.0f} | {df} | {p:.1e} | {'fails' if p <= T.ALPHA else 'passes'} |", flush=True)
    DE.verify_drafts = V.verify_drafts
