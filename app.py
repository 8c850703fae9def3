"""MARS Playground: AR and MARS side by side, live tau, the speed-quality frontier, batches and
the KV cache, and how the training mask and the sliding window work.

    python app.py                      # the bundled models (assets/models/tiny-mars-b4 + tiny-ar-sft)
    python app.py MODEL_FOLDER_OR_HUB_ID
    MARS_MODEL=... AR_MODEL=... python app.py   # AR_MODEL="" runs the AR side on the MARS model

All decoding goes through `mars_core`; the tabs live in `playground/` (one module each, added
here in one line); this file wires them into one page. `build_app(...)` returns the Blocks
(tests pass tiny models); `main()` launches it.
"""
import time

_T0 = time.perf_counter()  # noqa: E402 - start-to-ready is measured from here

import os  # noqa: E402
import sys  # noqa: E402
from dataclasses import replace  # noqa: E402

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gradio as gr  # noqa: E402

from mars_core import DecodeConfig, generate  # noqa: E402
from playground import style, tab_batch, tab_frontier, tab_how, tab_models, tab_playground  # noqa: E402
from playground import tab_train, tab_under_load  # noqa: E402
from playground.core import AppOptions, Core  # noqa: E402
from playground.models import BUNDLED_AR, BUNDLED_MARS, scrub  # noqa: E402
from playground.real_pair import RealPair  # noqa: E402
from playground.ui import UI  # noqa: E402

try:  # ZeroGPU on Hugging Face Spaces; a no-op everywhere else
    import spaces

    GPU = spaces.GPU
except ImportError:
    def GPU(fn=None, **_kwargs):
        return fn if fn is not None else (lambda f: f)

__all__ = ["AppOptions", "build_app", "launch", "main", "resolve_defaults"]

INTRO = """# MARS Playground
MARS fine-tunes an ordinary causal LM so that one forward pass can emit several tokens: after the text so
far it reads `B` predictions (the next token and `B - 1` masks) and accepts them left to right while the
confidence passes **tau**. At tau = 1 it *is* the AR model. Tokens are coloured by the forward that
produced them; hover or tap one for its confidence, and step through every forward in the replay.
"""


def resolve_defaults(mars_path=None, ar_path=None) -> tuple[str, str | None]:
    """Model sources: arguments, else MARS_MODEL / AR_MODEL, else the bundled pair.
    AR_MODEL="" (or ar_path="") means no AR baseline."""
    mars = mars_path or os.environ.get("MARS_MODEL") or BUNDLED_MARS
    if ar_path is not None:
        ar = ar_path or None
    elif "AR_MODEL" in os.environ:
        ar = os.environ["AR_MODEL"] or None
    elif mars == BUNDLED_MARS or os.path.isdir(BUNDLED_AR):
        ar = BUNDLED_AR if os.path.isdir(BUNDLED_AR) else None
    else:
        ar = None
    return mars, ar


def build_app(mars_path=None, ar_path=None, options: AppOptions | None = None, quantization=None,
              **overrides) -> gr.Blocks:
    """The Blocks app with its queue configured. `overrides` set AppOptions fields. The shared
    core is `demo.core`, each tab's handlers `demo.tabs[name]`. Raises ValueError if a model
    cannot be loaded."""
    opts = replace(options or AppOptions(), **overrides)
    mars_src, ar_src = resolve_defaults(mars_path, ar_path)
    core = Core(mars_src, ar_src, opts, quantization=quantization or os.environ.get("MARS_QUANTIZATION", "none"))
    if opts.real_pair and mars_src == BUNDLED_MARS and RealPair.offered():
        core.real = RealPair(core.store, quantization=core.quantization, on_ready=core.fastest.start).start()
    with gr.Blocks(title="MARS Playground", analytics_enabled=False) as demo:
        ui = UI(core)
        # ZeroGPU holds a GPU for `duration` s per call: a decode stops itself after max_seconds
        ui.gpu = lambda fn: GPU(fn, duration=int(opts.max_seconds) + 30)
        gr.Markdown(INTRO)
        status = gr.Markdown(core.model_status(), elem_id="model-status", label="models loaded")
        with gr.Tabs() as ui.tabs_box:
            tab_playground.add_tab(ui)
            tab_frontier.add_tab(ui)
            tab_batch.add_tab(ui)
            tab_under_load.add_tab(ui)
            tab_how.add_tab(ui)
            tab_train.add_tab(ui, status)  # after the tabs its hand-off refreshes
            tab_models.add_tab(ui, status)  # last: it refreshes what the others registered
        _wire_page_load(demo, ui, status)
    # max_size counts the waiting events of every concurrency id together, so only generations wait
    # in Gradio's queue: long jobs and model loads leave it at once and wait, bounded, in their own
    # (core.jobs, core.loads: playground.job_queue), each on one of Gradio's 40 worker threads.
    demo.queue(max_size=opts.max_queue, default_concurrency_limit=opts.concurrency_limit)
    demo.core, demo.tabs = core, ui.tabs
    _plain_arity_errors(demo)
    return demo


def _plain_arity_errors(demo: gr.Blocks) -> None:
    """A raw API call with too few values fails in Gradio before any handler runs, with a message
    that lists Python objects and memory addresses; since we hide non-Gradio errors
    (show_error=False) the caller then got `{"error": null}`. Say it plainly instead."""
    check = demo.validate_inputs

    def validate_inputs(block_fn, inputs):
        try:
            check(block_fn, inputs)
        except ValueError:
            wanted = sum(not isinstance(b, gr.State) for b in block_fn.inputs)
            raise gr.Error(f"/{block_fn.api_name} takes {wanted} values, got {len(inputs)}: send every parameter, "
                           "in order (the page's API link lists them; gradio_client fills in the defaults).",
                           print_exception=False) from None

    demo.validate_inputs = validate_inputs


def _wire_page_load(demo: gr.Blocks, ui: UI, status: gr.Markdown) -> None:
    """A page that opens gets the default pair of that moment (the real pair once it is ready), and
    while the real pair is prepared, its progress line in the status, refreshed every few seconds."""
    core = ui.core
    if core.real is None:
        if ui.page_load_outputs():
            demo.load(ui.page_load_values, [ui.session], ui.page_load_outputs(), queue=False, api_visibility="private")
        return

    def page_load(session, request: gr.Request = None):
        core.page_defaults(session)
        core.sessions.remember(getattr(request, "session_hash", None), session)
        return (core.model_status(session), *ui.model_hook_values(session))

    demo.load(page_load, [ui.session], [status, *ui.model_hook_outputs()], queue=False, api_visibility="private")
    timer = gr.Timer(3.0, active=core.real.state in ("waiting", "preparing"))
    timer.tick(lambda session: (core.model_status(session), gr.Timer(active=core.real.state == "preparing")),
               [ui.session], [status, timer], queue=False, show_progress="hidden", api_visibility="private")


# The app takes no files, but Gradio serves an upload route to anyone: a limit of a few bytes
# keeps an anonymous visitor from filling the server's disk through it.
MAX_UPLOAD_BYTES = 16


def launch(demo: gr.Blocks, **kwargs):
    """demo.launch with the app's CSS, no server-side rendering, no tracebacks to users and no uploads."""
    kw = dict(css=style.CSS, js=style.JS, ssr_mode=False, show_error=False, max_file_size=MAX_UPLOAD_BYTES)
    kw.update(kwargs)
    return demo.launch(**kw)


def _warm_up(core: Core) -> None:
    for loaded in filter(None, (core.mars, core.ar)):
        generate(loaded.model, loaded.tokenizer, ["Hi"], DecodeConfig(mode="mars", max_new_tokens=2,
                                                                      block_size=core.default_block))


def main(argv: list[str]) -> int:
    name = argv[0] if argv else os.environ.get("MARS_MODEL", BUNDLED_MARS)
    if name == BUNDLED_MARS and not os.path.isdir(name):
        print("The bundled default models are not built yet. Build them with\n"
              "  python -m training.build_default --output runs/default --install assets/models\n"
              "or pass a model folder / hub id: python app.py FOLDER", file=sys.stderr)
        return 2
    try:
        # MARS_REAL_PAIR=0: an operator who does not want the real pair fetched in the background
        demo = build_app(name, real_pair=os.environ.get("MARS_REAL_PAIR", "1") != "0")
    except ValueError as e:
        print(f"error: {scrub(str(e))}", file=sys.stderr)
        return 2
    _warm_up(demo.core)
    launch(demo, prevent_thread_lock=True)
    print(f"MARS Playground ready in {time.perf_counter() - _T0:.1f} s (imports included)", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
