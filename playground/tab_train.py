"""The Train tab: the MARS stage of `training/` run live from the bundled AR checkpoint on the bundled
synthetic task, its losses and evaluations drawn as it trains, and the result handed to the
Playground as the visitor's MARS side.

A run is a long job of kind "train" (one at a time server-wide, `playground.job_queue`), in a
process of its own (`playground.train_job`), within the server's time budget whatever it was sent.
The trained model lives in the session's memory only (`playground.trained`).
"""
from __future__ import annotations

import functools
import os
import time

import gradio as gr

from training.tiny_live import LR_FOR, LiveRecipe

from . import fields
from .core import Core
from .errors import guard
from .models import BUNDLED_AR, one_forward_at_a_time
from .runs import gated, in_place, kind_of, queued_html, settle, status_html
from .session import Session
from .train_job import TrainJob
from .train_view import RunView, summary_text
from .trained import TRAINED, TrainedLoaded
from .ui import UI
from .validate import as_choice, as_float, as_int

DEFAULT = LiveRecipe()
OBJECTIVES = [("mask-gated adapters (only the masks learn; tau 1 stays the AR model)", "gated"),
              ("the paper's MARS loss (the whole model learns)", "paper")]
LRS = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3)
B_RANGE, AR_WEIGHT_MAX, STEPS_MIN = (2, 8), 32.0, 10
UPDATE_S = 0.5  # the page is redrawn at most this often while a run trains


def as_bool(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1, "true", "false", "True", "False"):
        return value in (1, "true", "True")
    raise ValueError(f"{name} must be true or false, got {str(value)[:40]!r}")


class TrainTab:
    def __init__(self, core: Core, ui: UI | None = None):
        self.core, self.ui, self.opts = core, ui, core.opts

    @property
    def available(self) -> bool:
        return os.path.isdir(BUNDLED_AR)

    def recipe(self, objective, block_size, ar_weight, sft, lr, steps) -> LiveRecipe:
        """The run's recipe from the page's (or the API's) values, each checked against the slider's range."""
        if not self.available:
            raise ValueError("Training needs the bundled AR model (assets/models/tiny-ar-sft), which this server lacks.")
        return LiveRecipe(objective=as_choice("objective", objective, [k for _, k in OBJECTIVES]),
                          block_size=as_int("block size B", block_size, *B_RANGE),
                          ar_weight=as_float("ar_weight", ar_weight, 0.0, AR_WEIGHT_MAX), sft=as_bool("SFT term", sft),
                          lr=as_float("learning rate", lr, min(LRS), max(LRS)),
                          steps=as_int("steps", steps, STEPS_MIN, self.opts.train_max_steps),
                          threads=self.opts.train_threads, budget_s=self.opts.train_seconds,
                          eval_n=self.opts.train_eval_n)

    def _job(self, recipe: LiveRecipe) -> TrainJob:
        # the child's own clock stops training at the budget; this bound ends it whatever happens
        # inside (its start-up, the last evaluation, a hang)
        return TrainJob(recipe, recipe.budget_s + 90, self.opts.train_memory_mb).start()

    # ---- the page --------------------------------------------------------------------------------
    def train(self, objective, block_size, ar_weight, sft, lr, steps, session: Session):
        """Yields (progress, losses, evaluations, table, race button, status) while the run trains."""
        recipe = self.recipe(objective, block_size, ar_weight, sft, lr, steps)
        view = RunView(recipe.steps, recipe.budget_s, recipe.evals)
        job = self._job(recipe)
        session.train_job, session.train_result = job, None
        running = status_html("run", "Running: training in a process of its own; Stop keeps what was trained.")
        shown = 0.0
        try:
            yield (view.progress_html(), view.loss_figure(), view.eval_figure(), "", gr.update(interactive=False),
                   running)
            for event in job.events():
                view.add(event)
                if time.perf_counter() - shown >= UPDATE_S or event["type"] == "eval":
                    shown = time.perf_counter()
                    yield (view.progress_html(), view.loss_figure() if event["type"] == "step" else gr.skip(),
                           view.eval_figure() if event["type"] == "eval" else gr.skip(),
                           view.table_html() if event["type"] == "eval" else gr.skip(), gr.skip(), gr.skip())
        finally:
            session.train_job = None
        if job.result is None:
            raise ValueError(f"The training run failed: {job.error}")
        res = session.train_result = job.result
        words = summary_text(res.status, res.steps, res.seconds, res.evals, recipe.sft, recipe.objective)
        view.step = res.steps
        end = {"finished": "Done", "stopped": "Stopped", "time budget": "Stopped at the time budget"}[res.status]
        yield (view.progress_html(f"{end}: {res.steps} of {recipe.steps} steps in {res.seconds:.0f} s."),
               view.loss_figure(), view.eval_figure(), view.table_html(),
               gr.update(interactive=True), status_html("done" if res.status == "finished" else "stopped", words))

    def stop(self, status, session: Session):
        """A running run stops after its current step and keeps what it trained; a queued one is removed."""
        if session.train_job is not None:
            session.train_job.stop()
            return status_html("run", "Stopping: the current step ends, then what was trained is evaluated and kept…")
        if kind_of(status) == "queued":
            session.train_cancel = True
            return status_html("cancelled", "Cancelled: the queued training run was removed before it started.")
        return gr.skip()

    def hand_off(self, session: Session, result) -> TrainedLoaded:
        """The trained model as the session's MARS side (the AR side: the bundled AR it started from)."""
        from training.tiny_eval import build_model

        model, tok = build_model(result, prepack="auto")  # packed where that measures faster here
        one_forward_at_a_time(model)  # a gated model is shared by the duel's sides and the "fastest" measurement
        r = result.recipe
        name = f"your MARS model ({'gated' if r.objective == 'gated' else 'paper'}, B = {r.block_size}, {result.steps} steps)"
        loaded = TrainedLoaded(model, tok, f"{TRAINED}:{id(model)}", "none", name, r.block_size, result.evals,
                               r.objective)
        self.core.trained.put(session, loaded)  # a ValueError at the server's limit
        self.core.store.get(BUNDLED_AR)
        session.mars_source, session.ar_source, session.quantization = TRAINED, BUNDLED_AR, "none"
        return loaded

    def race(self, session: Session, request: gr.Request = None):
        """One click: the visitor's model becomes their session's MARS side, and the Playground opens."""
        if session.train_result is None:
            raise ValueError("Nothing trained yet in this session: press Train, then race the model when the run ends.")
        loaded = self.hand_off(session, session.train_result)
        self.core.sessions.remember(getattr(request, "session_hash", None), session)
        hooks = self.ui.model_hook_values(session) if self.ui is not None else []
        done = status_html("done", f"Loaded for your session: MARS side {loaded.name}, AR side the bundled AR model. "
                                   "It stays in memory while your session lasts.")
        return (self.core.model_status(session), *hooks, done, gr.Tabs(selected="playground"))

    # ---- the API ---------------------------------------------------------------------------------
    def api_train(self, objective: str = DEFAULT.objective, block_size: int = DEFAULT.block_size,
                  ar_weight: float = DEFAULT.ar_weight, sft: bool = DEFAULT.sft, lr: float | None = None,
                  steps: int = DEFAULT.steps, request: gr.Request = None) -> dict:
        """Train from the bundled AR model (the page's defaults and ranges; the server's time budget) and
        return when the run ends: its status, the loss curve's points, the evaluations. From then on
        this client's /generate decodes with the trained model on its MARS side (the AR side: the
        bundled AR model). `lr`: None is the objective's default, as the page sets it (5e-3 gated,
        5e-4 paper)."""
        session = self.core.session_of(request)
        lr = LR_FOR.get(objective, DEFAULT.lr) if lr is None else lr
        recipe = self.recipe(objective, block_size, ar_weight, sft, lr, steps)
        with self.core.jobs.enter(session, "train") as ticket:
            ticket.wait()
            job = self._job(recipe)
            for _ in job.events():
                pass
        if job.result is None:
            raise ValueError(f"The training run failed: {job.error}")
        res = job.result
        out = {"status": res.status, "steps": res.steps, "seconds": round(res.seconds, 1), "recipe": {
            k: getattr(recipe, k) for k in ("objective", "block_size", "ar_weight", "sft", "lr", "steps", "budget_s")},
            "curve": res.curve, "evals": res.evals,
            "summary": summary_text(res.status, res.steps, res.seconds, res.evals, recipe.sft, recipe.objective)}
        try:  # an API session keeps no result beside the model it hands over: the registry bounds those
            out["model"], out["loaded"] = self.hand_off(session, res).name, True
        except ValueError as e:
            out["model"], out["loaded"], out["message"] = None, False, str(e)
        return out


def until_cancelled(fn, session_at: int):
    """`fn`'s generator, ended quietly once Stop cancelled it while it waited in the queue."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        session = args[session_at]
        session.train_cancel = False
        inner = fn(*args, **kwargs)
        try:
            for out in inner:
                if session.train_cancel and session.train_job is None:
                    return
                yield out
        finally:
            inner.close()  # gives its place in the queue back at once
    return run


def add_tab(ui: UI, status: gr.Markdown) -> TrainTab:
    """After the tabs whose components follow a model change (the hand-off refreshes them)."""
    tab = TrainTab(ui.core, ui)
    o = ui.opts
    with gr.Tab("Train", id="train", elem_id="tab-train"):
        gr.Markdown(
            "### Watch MARS learn\nTrain the bundled 3.3M-parameter AR model into a MARS model here, live, with the "
            "same code as the command line (`training/`), on the same synthetic task (arithmetic, unit conversion, "
            "lists). The **noisy** loss is what the masks predict, the **clean** loss the ordinary next-token (SFT) "
            "term that keeps the model an AR model at one token per forward; a few times during the run it decodes "
            f"held-out problems at tau 0.95 and tau 1. One run at a time for all visitors, at most "
            f"{o.train_seconds / 60:.0f} minutes; then race what you trained in the Playground.")
        with gr.Row():
            with gr.Column(scale=3, min_width=300):
                objective = fields.Radio(OBJECTIVES, value=DEFAULT.objective, label="objective", elem_id="train-objective")
                paper = DEFAULT.objective == "paper"
                sft = gr.Checkbox(value=DEFAULT.sft, label="SFT term on (the clean loss; off: the paper's "
                                  "\"w/o SFT loss\" ablation)", elem_id="train-sft", interactive=paper)
                sft.preprocess = lambda payload: payload  # checked by the handler, like fields.*
                ar_weight = fields.Slider(0, AR_WEIGHT_MAX, value=DEFAULT.ar_weight, step=1, elem_id="train-ar-weight",
                                          label="ar_weight: weight of the clean (SFT) term", interactive=paper)
            with gr.Column(scale=2, min_width=300):
                block = fields.Slider(*B_RANGE, value=DEFAULT.block_size, step=1, label="block size B",
                                      elem_id="train-block")
                lr = fields.Dropdown([(f"{x:g}", x) for x in LRS], value=DEFAULT.lr, label="learning rate",
                                     elem_id="train-lr")
                steps = fields.Slider(STEPS_MIN, o.train_max_steps, value=DEFAULT.steps, step=10,
                                      label=f"steps (batches of {DEFAULT.batch_size} examples)", elem_id="train-steps")
        with gr.Row():
            go_btn = gr.Button("Train", variant="primary", elem_id="train-go", scale=3)
            stop_btn = gr.Button("Stop", elem_id="train-stop", scale=1)
        run_status = ui.job_status("train-status", "Press Train to start a run with these settings.")
        progress = gr.HTML(RunView(DEFAULT.steps, o.train_seconds, DEFAULT.evals).progress_html(
            "No run yet."), elem_id="train-progress", label="progress")
        with gr.Row(equal_height=False):
            losses = gr.Plot(RunView(0, 0, 0).loss_figure(), label="losses", elem_id="train-losses")
            evals = gr.Plot(RunView(0, 0, 0).eval_figure(), label="tokens per forward and accuracy",
                            elem_id="train-evals")
        table = gr.HTML("", elem_id="train-table", label="evaluations")
        race_btn = gr.Button("Race it in the Playground", variant="primary", interactive=False, elem_id="train-race")
        race_status = gr.HTML(status_html("info", "When a run has ended, this loads the model into your session's "
                                                  "Playground (MARS side; AR side: the bundled AR model)."),
                              elem_id="race-status", label="hand-off")
        ui.api(guard(tab.api_train), "train", "summary", **ui.job_limit)

    inputs = [objective, block, ar_weight, sft, lr, steps, ui.session]
    outputs = [progress, losses, evals, table, race_btn]
    n = len(outputs)
    # Train is off while a run of this page plays (a second run would draw into the same plots)
    armed = go_btn.click(lambda: (queued_html("training run"), gr.update(interactive=False)), None,
                         [run_status, go_btn], queue=False, api_visibility="private")
    work = until_cancelled(gated(ui.core.jobs, inputs.index(ui.session), "train", tab.train, n + 1, n),
                           inputs.index(ui.session))
    tab.page_train = in_place(work, n + 1, n)  # what the page runs (tests call it as Gradio does)
    running = armed.then(tab.page_train, inputs, [*outputs, run_status], api_name="train_stream",
                         show_progress="hidden", **ui.job_limit)
    running.then(lambda: gr.update(interactive=True), None, [go_btn], queue=False, api_visibility="private")
    running.failure(lambda status: (settle(status), gr.update(interactive=True)), [run_status], [run_status, go_btn],
                    queue=False, api_visibility="private")
    # the gated objective has no clean term to weigh: its controls are off there; each objective its own rate
    objective.change(lambda o: (*(gr.update(interactive=o == "paper"),) * 2, gr.update(value=LR_FOR.get(o, DEFAULT.lr))),
                     [objective], [sft, ar_weight, lr], queue=False, api_visibility="private")
    stop_btn.click(tab.stop, [run_status, ui.session], [run_status], queue=False, api_visibility="private")
    race_outputs = [status, *ui.model_hook_outputs(), race_status, ui.tabs_box]
    race = in_place(tab.race, len(race_outputs), len(race_outputs) - 2)
    race_btn.click(race, [ui.session], race_outputs, api_visibility="private", concurrency_limit=None,
                   concurrency_id="load")
    ui.tabs["train"] = tab
    return tab
