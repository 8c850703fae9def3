"""The gated MARS recipe on a GPU, in one command: more prompts, their answers, the stage.

    python -m training.gated_gpu --out runs/gated-gpu --prompts 20000 --minutes 10

1. `--template-prompts` prompts from our generator (`training.chat_prompts`, the same rule as the
   CPU run: ids divisible by 20 are held out), written to OUT/prompts.jsonl;
2. the base's own greedy answers to them (`training.distill`, batched on the cursor cache), to
   OUT/distill.jsonl; resumable, it skips the ids already there;
3. `--task-prompts` of code, factual questions, word problems and puzzles (`training.task_prompts`,
   ids from 300000; the kinds the generator covers thinly) to OUT/task-prompts.jsonl, and their
   answers to OUT/distill-task.jsonl;
4. the rest of `--prompts` as prompts that hand the model one of step 2's answers to work on
   (`training.context_prompts`: summaries, passages and a question, translation, extraction; ids
   from 200000) to OUT/context-prompts.jsonl, and their answers to OUT/distill-context.jsonl. The
   template generator is not asked for all 20,000: past about 6,000 its single-subject prompts
   (4,860 in all) run out and what it adds is mostly comparisons of two subjects (40% of 20,000,
   10% of the CPU's 2,400) and arithmetic;
5. the gated stage (`training.gated_stage`) on the answer files, at the paper's effective batch (384
   examples a step), bf16 base and fp32 adapters, soft targets (KL to the base), to OUT/stage;
6. then hard targets (the answer's token) from its adapters at half its learning rate, to
   OUT/stage-hard: the recipe the CPU measured best (docs/smollm2.md: soft targets teach the masks
   what the base would say, hard ones make them confident enough for tau). `--hard-share` of the
   minutes left after step 2 go to this stage (0: soft only, then OUT/stage is the result).

Export the result with `python -m training.gate_export OUT/stage-hard/latest.pt FOLDER`.

`accelerate` picks the device (one GPU; `accelerate launch` is not needed for one). Every part
resumes: run the same command again. On a CPU it runs too (tiny `--prompts` for a smoke test).
"""
from __future__ import annotations

import argparse
import os
import time

import torch


def write_prompts(path: str, make, first_id: int = 0) -> None:
    """`make()`'s prompts to `path` once, ids from `first_id` (a rerun keeps the file)."""
    from training.chat_prompts import write_prompt_file

    if not os.path.isfile(path):
        write_prompt_file(path, make(), first_id)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--base", default="smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, default=20000, help="prompts in all: the generator's, task "
                   "prompts, then context prompts")
    p.add_argument("--template-prompts", type=int, default=6000, help="of them, the generator's (then the task "
                   "prompts, and the rest hand the model one of their answers)")
    p.add_argument("--task-prompts", type=int, default=3000, help="of them, training.task_prompts's (code, "
                   "questions, word problems, puzzles)")
    p.add_argument("--seed", type=int, default=1, help="the generator's seed (the CPU run's prompts are seed 0)")
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--distill-batch", type=int, default=128)
    p.add_argument("--accum", type=int, default=384, help="examples per optimizer step (the paper's effective batch)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--epochs", type=float, default=4.0)
    p.add_argument("--minutes", type=float, default=10.0, help="the whole command's budget")
    p.add_argument("--hard-share", type=float, default=0.25,
                   help="the share of the training minutes for the hard-target stage (0 to 0.9)")
    p.add_argument("--hard-epochs", type=float, default=0.5, help="the hard-target stage's schedule")
    args = p.parse_args(argv)
    if args.prompts < 1 or args.template_prompts < 1 or args.task_prompts < 0:
        print("error: --prompts and --template-prompts must be at least 1, --task-prompts at least 0")
        return 2
    if not 0 <= args.hard_share <= 0.9:
        print(f"error: --hard-share {args.hard_share}: give a share of the minutes from 0 to 0.9")
        return 2
    from accelerate import Accelerator

    from mars_core import load_model
    from training.chat_prompts import make_prompts
    from training.context_prompts import FIRST_ID as FIRST_CONTEXT_ID, make_context_prompts, read_answers, usable
    from training.task_prompts import FIRST_ID as FIRST_TASK_ID, make_task_prompts

    began = time.time()
    device = str(Accelerator().device)
    os.makedirs(args.out, exist_ok=True)
    data = [os.path.join(args.out, "distill.jsonl")]
    templates = min(args.prompts, args.template_prompts)
    tasks = min(args.prompts - templates, args.task_prompts)
    contexts = args.prompts - templates - tasks
    try:
        model, tok = load_model(args.base, dtype="float32", device=device)
        write_prompts(os.path.join(args.out, "prompts.jsonl"), lambda: make_prompts(templates, args.seed))
        answer(model, tok, os.path.join(args.out, "prompts.jsonl"), data[0], args)
        if tasks > 0:
            data.append(os.path.join(args.out, "distill-task.jsonl"))
            write_prompts(os.path.join(args.out, "task-prompts.jsonl"), lambda: make_task_prompts(tasks, args.seed),
                          first_id=FIRST_TASK_ID)
            answer(model, tok, os.path.join(args.out, "task-prompts.jsonl"), data[-1], args)
        if contexts > 0:
            data.append(os.path.join(args.out, "distill-context.jsonl"))
            write_prompts(os.path.join(args.out, "context-prompts.jsonl"), lambda: make_context_prompts(
                usable(read_answers(data[:1])), contexts, args.seed), first_id=FIRST_CONTEXT_ID)
            answer(model, tok, os.path.join(args.out, "context-prompts.jsonl"), data[-1], args)
        del model
    except ValueError as e:
        print(f"error: {e}")
        return 2
    print(f"distilled in {(time.time() - began) / 60:.1f} min", flush=True)
    return train_stages(args, data, device, began)


def answer(model, tok, prompts: str, out: str, args) -> None:
    from training.distill import distill, read_prompts

    with torch.inference_mode():
        distill(model, tok, read_prompts(prompts), out, args.max_new_tokens, args.distill_batch,
                log=lambda s: print(s, flush=True))


def train_stages(args, data: list[str], device: str, began: float) -> int:
    """Soft targets, then hard ones from their adapters, in what is left of --minutes."""
    from training.gated_stage import main as stage

    left = args.minutes - (time.time() - began) / 60
    common = ["--base", args.base, "--data", *data, "--device", device, "--rank", str(args.rank),
              "--dtype", "bfloat16" if device != "cpu" else "float32", "--accum", str(args.accum),
              "--snapshot-minutes", "2", "--warmup", "5"]
    soft, hard = os.path.join(args.out, "stage"), os.path.join(args.out, "stage-hard")
    if args.hard_share == 0 or not os.path.isfile(os.path.join(hard, "latest.pt")):  # once begun, hard goes on
        code = stage(common + ["--out", soft, "--lr", str(args.lr), "--epochs", str(args.epochs),
                               "--minutes", str(max(left * (1 - args.hard_share), 0.5))])
        if code or args.hard_share == 0:
            return code
    left = args.minutes - (time.time() - began) / 60
    return stage(common + ["--out", hard, "--init", os.path.join(soft, "latest.pt"), "--targets", "hard",
                           "--lr", str(args.lr / 2), "--epochs", str(args.hard_epochs), "--minutes", str(max(left, 0.5))])


if __name__ == "__main__":
    raise SystemExit(main())
