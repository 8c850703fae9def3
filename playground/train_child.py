"""The Train tab's run, in a process of its own: `python -m playground.train_child RECIPE_JSON`.

Why a process and not a thread of the server: torch's thread count is per process, so a run in
the server would take both cores from the visitors' generations (here it takes `threads`, one on a
2-core machine); a run that runs out of memory or crashes ends alone; and the server can end it
at its time budget, whatever happens inside.

Protocol (pipes only: nothing is written to disk):
    stdout  one JSON event per line (`training.tiny_live`'s events), then `RESULT <n>` and n bytes:
            `torch.save` of {"status", "steps", "seconds", "curve", "evals", "state"}; or `ERROR <text>`
    stdin   a line "stop": finish the current step, evaluate, send what was trained. End of input
            (the server went away) stops it the same way.
"""
from __future__ import annotations

import io
import json
import os
import sys
import threading


class StdinStop:
    """`requested` once the parent writes "stop" or closes the pipe."""

    def __init__(self):
        self.requested = False
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        self.requested = True


def main(argv: list[str]) -> int:
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything a library prints must not corrupt the protocol

    def send(line: str) -> None:
        out.write(line.encode("utf-8") + b"\n")
        out.flush()

    try:
        import torch

        from training.tiny_live import LiveRecipe, train_live

        recipe = LiveRecipe(**json.loads(argv[0]))
        torch.set_num_threads(recipe.threads)
        res = train_live(recipe, lambda e: send(json.dumps(e)), StdinStop())
        buf = io.BytesIO()
        torch.save({"status": res.status, "steps": res.steps, "seconds": res.seconds, "curve": res.curve,
                    "evals": res.evals, "state": res.state}, buf)
        data = buf.getvalue()
        send(f"RESULT {len(data)}")
        out.write(data)
        out.flush()
        return 0
    except Exception as e:  # noqa: BLE001 - one line for the parent, the traceback to stderr
        import traceback

        traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        send(f"ERROR {type(e).__name__}: {first}"[:400])
        return 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv[1:]))
