"""The training loop: one micro-batch's loss, optimizer steps, logging and checkpoint cadence."""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import TYPE_CHECKING, Iterable

import torch

from training.checkpoint import LOG_FILE, list_checkpoints, save_checkpoint
from training.signals import StopSignal
from training.train_config import TrainConfig

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import PreTrainedTokenizerBase

    from training.checkpoint import TrainState
    from training.data import LengthGroupedBatchSampler

def forward_loss(model: torch.nn.Module, batch: dict, config: TrainConfig, mask_id: int) -> tuple[torch.Tensor, dict]:
    """The loss to backpropagate and its logged parts for one micro-batch (B, T)."""
    from mars_core import mars_loss
    from mars_core.loss import shifted_ce

    if config.stage == "ar":
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
        loss = shifted_ce(logits, batch["labels"])
        return loss, {"loss": loss.detach()}
    out = mars_loss(model, batch["input_ids"], batch["labels"], batch["attention_mask"],
                    block_size=config.block_size, mask_token_id=mask_id, ar_weight=config.ar_weight)
    return out.total, {"loss": out.total.detach(), "noisy": out.noisy.detach(), "clean": out.clean.detach()}


class Run:
    """One training session: the prepared objects plus the loop, logging and checkpoints."""

    def __init__(self, accelerator: Accelerator, config: TrainConfig, model: torch.nn.Module,
                 tokenizer: PreTrainedTokenizerBase, optimizer: torch.optim.Optimizer, scheduler: object,
                 loader: torch.utils.data.DataLoader, sampler: LengthGroupedBatchSampler, total_steps: int,
                 state: TrainState):
        self.acc, self.config = accelerator, config
        self.model, self.tokenizer = model, tokenizer
        self.optimizer, self.scheduler = optimizer, scheduler
        self.loader, self.sampler = loader, sampler
        self.total_steps, self.state = total_steps, state
        self.mask_id = tokenizer.mask_token_id
        self.first_batch_sha1 = None
        self.last_saved = state.step
        self.bar = None

    # -- per step bookkeeping -------------------------------------------------
    def reduce_step(self, sums: dict, micro: int, tokens: int, stop: bool) -> tuple[dict, int, bool]:
        """Average the step's loss parts over micro-batches and ranks; sum tokens; OR the stop flags."""
        names = sorted(sums)
        local = torch.tensor([float(sums[n]) / micro for n in names] + [float(tokens), float(stop)],
                             dtype=torch.float64, device=self.acc.device)
        total = self.acc.reduce(local, "sum")
        world = self.acc.num_processes
        parts = {n: total[i].item() / world for i, n in enumerate(names)}
        return parts, int(total[-2].item()), bool(total[-1].item() > 0)

    def record(self, parts: dict, tokens: int, seconds: float) -> None:
        """Fold one step into the log window; write a record every --log-every steps."""
        window = self.state.window
        for name, value in parts.items():
            window[name] = window.get(name, 0.0) + value
        window["steps"] = window.get("steps", 0) + 1
        window["tokens"] = window.get("tokens", 0) + tokens
        window["seconds"] = window.get("seconds", 0.0) + seconds
        lr = self.scheduler.get_last_lr()[0]
        if self.bar is not None:
            self.bar.update(1)
            shown = {k: f"{v:.3f}" for k, v in parts.items()}
            self.bar.set_postfix(**shown, lr=f"{lr:.2e}", tok_s=f"{tokens / max(seconds, 1e-9):.0f}")
        if self.state.step % self.config.log_every and self.state.step != self.total_steps:
            return
        n = window.pop("steps")
        progress = self.state.epoch + self.state.batch_in_epoch / len(self.loader)  # epochs done, fractional
        record = {"step": self.state.step, "epoch": round(progress, 4), "lr": lr}
        record.update({k: window.pop(k) / n for k in list(window) if k not in ("tokens", "seconds")})
        record["tokens_per_s"] = window.pop("tokens") / max(window.pop("seconds"), 1e-9)
        self.state.window = {}
        if self.acc.is_main_process:
            with open(os.path.join(self.config.output, LOG_FILE), "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def checkpoint(self) -> None:
        """Save unless this step is already saved."""
        if self.state.step == self.last_saved and list_checkpoints(self.config.output):
            return
        save_checkpoint(self.acc, self.config, self.state)  # its time is not counted in `seconds`
        self.last_saved = self.state.step

    # -- the loop -----------------------------------------------------------------
    def micro_step(self, batch: dict) -> dict:
        """Forward/backward of one micro-batch; the optimizer steps when accelerate syncs."""
        if self.first_batch_sha1 is None:
            self.first_batch_sha1 = hashlib.sha1(batch["input_ids"].cpu().numpy().tobytes()).hexdigest()
        with self.acc.accumulate(self.model):
            loss, parts = forward_loss(self.model, batch, self.config, self.mask_id)
            self.acc.backward(loss)
            if self.acc.sync_gradients and self.config.max_grad_norm > 0:
                self.acc.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
            self.optimizer.step()
            if self.acc.sync_gradients:
                self.scheduler.step()
            self.optimizer.zero_grad()
        return parts

    def epoch_batches(self) -> Iterable[dict]:
        """This rank's micro-batches for the current epoch, past those already consumed."""
        # accelerate's loader re-sets its sampler's epoch to its own iteration counter on every
        # pass (and a skip_first_batches copy inherits that counter): set both, before copying
        self.loader.set_epoch(self.state.epoch)
        self.sampler.set_epoch(self.state.epoch)
        skip = self.state.batch_in_epoch
        return self.acc.skip_first_batches(self.loader, skip) if skip else self.loader

    def run(self, stop: StopSignal) -> str:
        """Train until the last step, --stop-at, or a signal. Returns the status."""
        sums, micro, tokens, started = {}, 0, 0, time.perf_counter()
        while self.state.step < self.total_steps:
            for batch in self.epoch_batches():
                parts = self.micro_step(batch)
                for name, value in parts.items():
                    sums[name] = sums.get(name, 0.0) + value
                micro += 1
                tokens = tokens + batch["attention_mask"].sum()  # a tensor: no device sync per micro-batch
                self.state.batch_in_epoch += 1
                if not self.acc.sync_gradients:
                    continue
                status = self.after_step(sums, micro, tokens, time.perf_counter() - started, stop)
                sums, micro, tokens, started = {}, 0, 0, time.perf_counter()
                if status:
                    return status
            # after_step has already moved the position past the finished epoch: the last
            # batch of an epoch always ends an optimizer step (accelerate syncs at the end)
        return "finished"

    def after_step(self, sums: dict, micro: int, tokens: int, seconds: float, stop: StopSignal) -> str | None:
        """Bookkeeping after an optimizer step; a status when the loop must end."""
        if self.state.batch_in_epoch >= len(self.loader):  # the epoch is used up: point past it
            self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0
        self.state.step += 1
        parts, tokens, stop_now = self.reduce_step(sums, micro, tokens, stop.requested)
        self.state.tokens += tokens
        self.state.seconds += seconds
        self.record(parts, tokens, seconds)
        status = None
        if self.state.step >= self.total_steps:
            status = "finished"
        elif stop_now:
            status = "interrupted"
        elif self.config.stop_at is not None and self.state.step >= self.config.stop_at:
            status = "stopped"
        every = self.config.save_every
        if status or (every and self.state.step % every == 0):
            self.checkpoint()
        return status
