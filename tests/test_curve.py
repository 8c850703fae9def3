import json

import pytest
import torch

from benchmarks.curve import earlier_points


def test_a_continued_run_starts_from_the_earlier_runs_curve(tmp_path):
    prior = tmp_path / "v2"
    (prior / "curve").mkdir(parents=True)
    run = tmp_path / "v3"
    run.mkdir()
    (run / "args.json").write_text(json.dumps({"init": str(prior / "latest.pt")}))
    with pytest.raises(ValueError, match="curve is not measured"):
        earlier_points(str(run))
    points = [{"snapshot": "base", "minutes": 0.0, "lossless": 1.04},
              {"snapshot": "step000100", "minutes": 10.0, "lossless": 1.3},
              {"snapshot": "step000200", "minutes": 20.0, "lossless": 1.4}]
    (prior / "curve" / "curve.json").write_text(json.dumps(points))
    (prior / "snapshots").mkdir()
    torch.save({"state": {"minutes": 10.0}}, prior / "snapshots" / "step000100.pt")
    torch.save({"state": {"minutes": 20.0}}, prior / "latest.pt")

    (run / "args.json").unlink()
    assert earlier_points(str(run)) is None  # no args.json: a run from the base
    (run / "args.json").write_text(json.dumps({"init": None}))
    assert earlier_points(str(run)) is None
    (run / "args.json").write_text(json.dumps({"init": str(prior / "snapshots" / "step000100.pt")}))
    # started from a mid-run snapshot: the earlier run's later points are not this run's past
    assert [p["snapshot"] for p in earlier_points(str(run))] == ["v2 base", "v2 step000100"]
    (run / "args.json").write_text(json.dumps({"init": str(prior / "latest.pt")}))
    got = earlier_points(str(run))
    assert [p["minutes"] for p in got] == [0.0, 10.0, 20.0]
    assert got[-1]["lossless"] == 1.4
