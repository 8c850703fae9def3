"""DecodeStats' derived figures (the playground's batch tab reads them)."""
from mars_core import DecodeStats


def test_idle_slots_counts_waits_not_the_tail_after_finishing():
    s = DecodeStats(accepted_per_step=[[2, 1], [0, 1], [1, 0], [0, 0]])
    # sequence 0 waited once (step 2) before its last token; sequence 1 finished after step 2
    assert s.idle_slots == 1
    assert DecodeStats().idle_slots == 0
    assert DecodeStats(accepted_per_step=[[0, 3], [0, 1], [4, 0]]).idle_slots == 2
