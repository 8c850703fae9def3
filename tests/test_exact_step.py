"""The one exact step's decision (`exact_step.decide`) on scripted logits, from the rule: the
longest confirmed path, the token after it, their confidences, the group after the path's end and
its candidates; padding never accepted; a stop id cuts."""
import pytest
import torch

from mars_core.draft_plan import Plan
from mars_core.exact_step import build_window, decide, read_extra
from mars_core.tree import DraftShape, chain

V, M, PAD, MASK = 12, 2, 0, 11


def one_hot(ids: list[int], strength: float = 8.0) -> torch.Tensor:
    """Logits whose argmax at row i is ids[i] (softmax prob of it: e^8 / (e^8 + V - 1))."""
    out = torch.zeros(len(ids), V)
    out[torch.arange(len(ids)), torch.tensor(ids)] = strength
    return out


def run(plan: Plan, N: int, G: int, preds: list[int], groups: list[list[int]], remaining=50, stop=(10,)):
    """One row: `preds` the argmax at the root and each node (padding included), `groups` the
    argmax of each group's masks."""
    w = build_window([plan], [[5]], N, G, MASK, PAD, "cpu")
    node_logits = one_hot(preds)[None]  # (1, N + 1, V)
    group_logits = torch.stack([one_hot(g) for g in groups])[None] if G else torch.zeros(1, 0, M, V)
    out = decide(node_logits, group_logits, w, torch.tensor([remaining]), torch.tensor([True]),
                 torch.tensor(list(stop)), depth=3, topk=2, max_accept=None, metric="probability")
    row = out.packed[0].tolist()
    D1 = 4  # depth + 1 columns of tokens
    take = int(row[2 * D1])
    return row[:take], int(row[2 * D1 + 1]), read_extra(row[2 * D1 + 2:], M, 2), out


def test_a_tree_path_off_the_first_branch_then_the_bonus_and_the_group_after_its_end():
    # root -> 1 (3) -> 2 (4); root -> 3 (6) -> 4 (7); groups after 0, 2 and 4
    plan = Plan(DraftShape((0, 1, 0, 3), M, (0, 2, 4)), (3, 4, 6, 7))
    #        root  n1 n2 n3 n4: the root predicts 6 (node 3), node 3 predicts 7 (node 4), node 4 predicts 9
    preds = [6, 1, 1, 7, 9]
    groups = [[1, 1], [2, 2], [8, 9]]
    taken, done, (j, cands), out = run(plan, 4, 3, preds, groups)
    assert taken == [6, 7, 9] and j == 2 and not done
    assert out.path[0].tolist()[:2] == [3, 4]
    assert cands.ids[0][0] == 8 and cands.ids[1][0] == 9  # the group after node 4, the path's end
    assert cands.probs[0][0] == pytest.approx(torch.softmax(one_hot([8])[0], -1)[8].item())


def test_no_group_after_the_end_means_no_candidates():
    plan = Plan(chain(2, M, (2,)), (3, 4))  # "last": a group after the last draft only
    taken, _, (j, cands), _ = run(plan, 2, 1, [3, 9, 1], [[1, 1]])  # node 1 is accepted, node 2 is not
    assert taken == [3, 9] and j == 1 and not cands


def test_a_padding_leaf_is_never_accepted_even_where_the_root_predicts_the_pad_token():
    plan = Plan(chain(1, M, (0, 1)), (3,))  # one real node, padded to 3 below
    taken, _, (j, _), _ = run(plan, 3, 2, [PAD, 1, 1, 1], [[1, 1], [2, 2]])
    assert j == 0 and taken == [PAD]  # the model's own token, not an accepted padding draft


def test_a_stop_id_in_the_path_cuts_the_row():
    plan = Plan(chain(3, M, (3,)), (3, 10, 4))
    taken, done, (j, cands), _ = run(plan, 3, 1, [3, 10, 4, 2], [[1, 1]])
    assert taken == [3] and done and j == 3 and not cands  # cut at the stop id; a finished row drafts nothing


def test_confidences_are_the_models_at_the_node_before_each_token():
    plan = Plan(chain(2, M, (0, 1, 2)), (3, 4))
    w = build_window([plan], [[5]], 2, 3, MASK, PAD, "cpu")
    logits = torch.stack([one_hot([3], 2.0)[0], one_hot([4], 5.0)[0], one_hot([7], 1.0)[0]])[None]
    out = decide(logits, torch.zeros(1, 3, M, V), w, torch.tensor([50]), torch.tensor([True]), torch.tensor([10]),
                 depth=2, topk=2, max_accept=None, metric="probability")
    conf = out.packed[0, 3:6].tolist()
    want = [torch.softmax(logits[0, i], -1)[t].item() for i, t in enumerate([3, 4, 7])]
    assert conf == pytest.approx(want)
