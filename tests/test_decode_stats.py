"""DecodeStats' derived figures (the playground's batch tab reads them)."""
from mars_core import DecodeStats


def test_idle_slots_counts_waits_not_the_tail_after_finishing():
    s = DecodeStats(accepted_per_step=[[2, 1], [0, 1], [1, 0], [0, 0]])
    # sequence 0 waited once (step 2) before its last token; sequence 1 finished after step 2
    assert s.idle_slots == 1
    assert DecodeStats().idle_slots == 0
    assert DecodeStats(accepted_per_step=[[0, 3], [0, 1], [4, 0]]).idle_slots == 2


import pytest  # noqa: E402

from mars_core import DecodeConfig, stream  # noqa: E402
from mars_core.acceptance import passes  # noqa: E402
import torch  # noqa: E402


@pytest.mark.parametrize("cache", ["none", "sliding", "cursor", "block"])
def test_step_events_carry_every_prediction_of_the_block(confident_model, tokenizer, cache):
    """`proposed` holds all B predictions; the accepted tokens are its prefix, and the count is
    what tau decides: every accepted one after the first passes, the first rejected one fails
    (unless the step was cut by EOS or the token limit)."""
    tau, B = 0.6, 4
    cfg = DecodeConfig(mode="mars", tau=tau, block_size=B, cache=cache, max_new_tokens=60)
    events = list(stream(confident_model, tokenizer, "Sort the list 45, 12, 88, 31", cfg))
    assert sum(len(e.tokens[0]) for e in events) == 60
    saw_reject = False
    for e in events:
        prop, conf = e.proposed[0], e.proposed_confidences[0]
        k = len(e.tokens[0])
        assert len(prop) == len(conf) == B
        assert prop[:k] == e.tokens[0] and conf[:k] == e.confidences[0]
        ok = passes(torch.tensor(conf), tau, "probability").tolist()
        assert all(ok[1:k])
        if k < B and not e.finished[0]:
            assert not ok[k]
            saw_reject = True
    assert saw_reject  # the test saw a rejected prediction, not only full blocks
