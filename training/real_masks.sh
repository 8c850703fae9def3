#!/bin/sh
# Issue 51's queue for the real model's masks on a CPU: every stage, in order, in one command that
# resumes wherever it stopped (run it from anywhere; it works in the repository root):
#
#     nohup sh training/real_masks.sh > runs/real_masks.log 2>&1 &
#
# A stage whose output is complete is skipped; one that was cut resumes (distillation skips the
# answers written, a gated stage resumes from its latest.pt). Its state lives in runs/ (outside
# git). On a machine without runs/gated-hard, gated-more starts from the shipped gate instead (rank 8).
# The stages, and what each measured, are in docs/smollm2.md ("The data lever", "Where on Spec-Bench"):
#   1. runs/more: the base's answers to 2,851 more prompts of the template generator;
#   2. runs/gated-more: one epoch of hard targets over all 4,988 training answers;
#   3. runs/context: 2,400 prompts over the base's own answers (summaries, passages, translation,
#      extraction), distilled; runs/tasks: 1,200 of code, questions, word problems and puzzles;
#   4. runs/gated-wide: one epoch over 3 and the first 1,200 committed answers, from 2's end;
#   after 2 and 4, each run's end replayed (runs/measure/RUN-dev.json, -si48.json, and for gated-wide
#      -sb130.json: Spec-Bench's first 10 of each category), where the base's runs are there;
#   5. with the Spec-Bench base run there (runs/eval/sb480-base, runs/evalsets/question.jsonl), the
#      shipped gate's tau 0.9 row on Spec-Bench for the card: 10 of each category, then all 480.
# THREADS (default 2) and MINUTES (default 600, per stage and call) pass to the gated stages.
set -u
cd "$(dirname "$0")/.."
T=${THREADS:-2}
M=${MINUTES:-600}
done_at() {  # a gated stage's folder whose latest.pt is at its schedule's end
  python -c "import sys,torch; s=torch.load('$1/latest.pt',map_location='cpu',weights_only=False)['state']; sys.exit(s['step']<s['total_steps'])" 2>/dev/null
}
stage() {  # OUT INIT RANK DATA...: one hard-target epoch, the recipe docs/smollm2.md measured
  out=$1 init=$2 rank=$3; shift 3
  python -m training.gated_stage --data "$@" --out "$out" --init "$init" --targets hard --dtype float32 \
    --rank "$rank" --lr 1e-3 --warmup 10 --epochs 1 --groups 64 --minutes "$M" --snapshot-minutes 8 --threads "$T"
}
measure() {  # RUN [spec-bench]: its end replayed on the held-out 60, self-instruct 48 and (asked) Spec-Bench 130
  m="--model smollm2-135m-instruct --layers runs/$1/latest.pt --threads $T"; o=runs/measure/$1
  mkdir -p runs/measure
  [ -s "$o-dev.json" ] || python -m benchmarks.mask_replay --distill data/smollm2/distill.jsonl --split dev \
    --limit 60 $m --out "$o-dev.json" || return 1
  if [ -f runs/eval/si48-base/outputs.jsonl ] && [ -f runs/evalsets/user_oriented_instructions.jsonl ]; then
    [ -s "$o-si48.json" ] || python -m benchmarks.mask_replay --run runs/eval/si48-base \
      --self-instruct runs/evalsets/user_oriented_instructions.jsonl $m --out "$o-si48.json" || return 1
  fi
  if [ $# -gt 1 ] && [ -f runs/eval/sb480-base/outputs.jsonl ] && [ -f runs/evalsets/question.jsonl ]; then
    [ -s "$o-sb130.json" ] || python -m benchmarks.mask_replay --run runs/eval/sb480-base \
      --spec-bench runs/evalsets/question.jsonl --per-category 10 $m --out "$o-sb130.json" || return 1
  fi
}
mkdir -p runs
echo "$(date -u +%FT%TZ) real_masks: start"

python -m training.more_answers --out runs/more || exit 1
if ! done_at runs/gated-more; then
  if [ -f runs/gated-hard/latest.pt ]; then init=runs/gated-hard/latest.pt rank=16
  else init=assets/models/smollm2-135m-mars rank=8; fi
  stage runs/gated-more "$init" "$rank" data/smollm2/distill.jsonl runs/more/distill-0.jsonl \
    runs/more/distill-1.jsonl --first 5251 || exit 1
  done_at runs/gated-more || { echo "gated-more stopped before its end (MINUTES=$M): run this again"; exit 1; }
fi
measure gated-more || exit 1

python -m training.more_answers --out runs/context --n 2400 --seed 0 --contexts data/smollm2/distill.jsonl \
  runs/more/distill-0.jsonl runs/more/distill-1.jsonl || exit 1
python -m training.more_answers --out runs/tasks --n 1200 --seed 0 --tasks || exit 1
if ! done_at runs/gated-wide; then
  rank=$(python -c "import torch; print(torch.load('runs/gated-more/latest.pt',map_location='cpu',weights_only=False)['state']['args']['rank'])")
  stage runs/gated-wide runs/gated-more/latest.pt "$rank" runs/context/distill-0.jsonl runs/context/distill-1.jsonl \
    runs/tasks/distill-0.jsonl runs/tasks/distill-1.jsonl data/smollm2/distill.jsonl --first 4800 || exit 1
  done_at runs/gated-wide || { echo "gated-wide stopped before its end (MINUTES=$M): run this again"; exit 1; }
fi
measure gated-wide spec-bench || exit 1

E=runs/eval/sb480-h285r8q4
if [ ! -f runs/eval/sb480-base/outputs.jsonl ] || [ ! -f runs/evalsets/question.jsonl ]; then
  echo "no Spec-Bench base run here: the tau row is skipped (docs/smollm2.md says how to make one)"
  exit 0
fi
mkdir -p $E
[ -s $E/outputs.jsonl ] || grep '"setting": "ar"' runs/eval/sb480-base/outputs.jsonl > $E/outputs.jsonl
for limit in "--per-category 10 --repeat-guard" "--guard-only"; do  # with and without the guard on 130, guarded on 480
  # shellcheck disable=SC2086  # $limit is several words
  python -m benchmarks.real_eval --model smollm2-135m-mars --spec-bench runs/evalsets/question.jsonl --taus 0.9 \
    --no-lossless --no-ar --max-new-tokens 256 --out $E --threads "$T" $limit || exit 1
done
echo "$(date -u +%FT%TZ) real_masks: every stage is done"
