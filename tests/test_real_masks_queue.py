"""training/real_masks.sh: issue 51's stages in order, each skipped once complete, gated-more started
from the shipped gate where the machine has no earlier run. Run against a stand-in `python` that
logs its arguments: a gated stage "completes" by writing OUT/DONE, which the done-check reads."""
import os
import shutil
import stat
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "training" / "real_masks.sh"

FAKE = r"""#!/bin/sh
echo "$*" >> "$LOG"
case "$1" in
  -c) case "$2" in
        *"print("*) echo 16; exit 0;;
      esac
      folder=$(echo "$2" | grep -o "runs/[a-z-]*" | head -1)
      [ -f "$folder/DONE" ] && exit 0 || exit 1;;
esac
if [ "$2" = training.gated_stage ]; then
  out=$(echo "$*" | sed 's/.*--out \([^ ]*\).*/\1/'); mkdir -p "$out"; [ -f "$out/CUT" ] || touch "$out/DONE"
fi
[ "$2" = benchmarks.mask_replay ] && echo "{}" > "$(echo "$*" | sed 's/.*--out \([^ ]*\).*/\1/')"
exit 0
"""


def _run(tmp_path):
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "LOG": str(tmp_path / "log")}
    (tmp_path / "log").write_text("")
    done = subprocess.run(["sh", str(tmp_path / "repo" / "training" / "real_masks.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    calls = [line for line in (tmp_path / "log").read_text().splitlines() if not line.startswith("-c")]
    return done.returncode, done.stdout, calls


def _setup(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text(FAKE)
    (tmp_path / "bin" / "python").chmod(stat.S_IRWXU)
    (tmp_path / "repo" / "training").mkdir(parents=True)
    shutil.copy(SCRIPT, tmp_path / "repo" / "training")


def test_every_stage_runs_in_order_then_a_rerun_skips_the_finished_ones(tmp_path):
    _setup(tmp_path)
    code, out, calls = _run(tmp_path)
    assert code == 0 and "no Spec-Bench base run here" in out
    modules = [c.split()[1] for c in calls]
    assert modules == ["training.more_answers", "training.gated_stage", "benchmarks.mask_replay", "training.more_answers",
                       "training.more_answers", "training.gated_stage", "benchmarks.mask_replay"]
    more, wide = calls[1], calls[5]
    assert "--layers runs/gated-more/latest.pt" in calls[2] and "--split dev" in calls[2]  # each run's end, measured
    assert "--layers runs/gated-wide/latest.pt" in calls[6]
    assert "--out runs/gated-more --init assets/models/smollm2-135m-mars" in more and "--rank 8" in more  # no earlier run here
    assert "--first 5251" in more and "--contexts" in calls[3] and "--tasks" in calls[4]
    assert "--init runs/gated-more/latest.pt" in wide and "--rank 16" in wide and "runs/tasks/distill-1.jsonl" in wide
    code, out, calls = _run(tmp_path)
    assert code == 0 and "training.gated_stage" not in " ".join(calls)  # both complete: not run again
    assert "benchmarks.mask_replay" not in " ".join(calls)  # nor measured again


def test_a_stage_cut_by_its_minutes_stops_the_queue_and_says_so(tmp_path):
    _setup(tmp_path)
    (tmp_path / "repo" / "runs" / "gated-more").mkdir(parents=True)
    (tmp_path / "repo" / "runs" / "gated-more" / "CUT").write_text("")
    (tmp_path / "repo" / "runs" / "gated-hard").mkdir()
    (tmp_path / "repo" / "runs" / "gated-hard" / "latest.pt").write_text("")
    code, out, calls = _run(tmp_path)
    assert code == 1 and "gated-more stopped before its end" in out
    assert "--init runs/gated-hard/latest.pt" in calls[1] and "--rank 16" in calls[1] and len(calls) == 2
