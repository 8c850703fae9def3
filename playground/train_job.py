"""One Train-tab run seen from the server: the child process (`playground.train_child`), its events,
Stop, and the bounds the server holds it to whatever it was sent (time, memory).

    job = TrainJob(recipe, limit_s=360, memory_mb=3000).start()
    for event in job.events():    # training.tiny_live's events, and {"type": "tick"} every half second
        show(event)
    job.result                    # a training.tiny_live.Result (None after an error: job.error says why)

Closing the `events` generator early (a visitor who left, a cancelled event) ends the child.
"""
from __future__ import annotations

import io
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict

from training.tiny_live import LiveRecipe, Result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK_S = 0.5


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB (0 where /proc is not there)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


class TrainJob:
    def __init__(self, recipe: LiveRecipe, limit_s: float, memory_mb: float):
        self.recipe, self.limit_s, self.memory_mb = recipe, limit_s, memory_mb
        self.result: Result | None = None
        self.error = ""
        self.peak_mb = 0.0
        self._events: queue.Queue = queue.Queue()
        self._stderr: deque[str] = deque(maxlen=20)
        self.proc: subprocess.Popen | None = None

    def start(self) -> TrainJob:
        env = dict(os.environ, OMP_NUM_THREADS=str(self.recipe.threads), TOKENIZERS_PARALLELISM="false",
                   PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, "-m", "playground.train_child", json.dumps(asdict(self.recipe))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     cwd=ROOT, env=env)
        self.started = time.perf_counter()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        return self

    def stop(self) -> None:
        """Finish the current step, evaluate, hand back what was trained."""
        try:
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def _read(self) -> None:
        out = self.proc.stdout
        for raw in iter(out.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith("RESULT "):
                data = out.read(int(line.split()[1]))
                self._events.put({"type": "_result", "data": data})
                break
            if line.startswith("ERROR "):
                self._events.put({"type": "_error", "text": line[6:]})
                break
            try:
                self._events.put(json.loads(line))
            except ValueError:
                continue  # not ours: ignored
        self._events.put({"type": "_eof"})

    def _drain_stderr(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            self._stderr.append(raw.decode("utf-8", "replace").rstrip())

    def _result(self, data: bytes) -> Result:
        import torch

        got = torch.load(io.BytesIO(data), weights_only=True)
        return Result(got["status"], got["steps"], got["seconds"], got["state"], self.recipe, got["curve"], got["evals"])

    def events(self):
        """Yield the run's events until it ends; then `result` or `error` is set."""
        try:
            while True:
                try:
                    event = self._events.get(timeout=TICK_S)
                except queue.Empty:
                    event = {"type": "tick"}
                kind = event["type"]
                if kind == "_result":
                    self.result = self._result(event["data"])
                    return
                if kind == "_error":
                    self.error = event["text"]
                    return
                if kind == "_eof":
                    self.proc.wait(10)
                    self.error = f"the training process ended without a result (exit status {self.proc.returncode})"
                    return
                over = self._over_bounds()
                if over:
                    self.kill()
                    self.error = over
                    return
                yield event
        finally:
            self.kill()

    def _over_bounds(self) -> str:
        used = rss_mb(self.proc.pid)
        self.peak_mb = max(self.peak_mb, used)
        if used > self.memory_mb:
            return (f"the run needed more than {self.memory_mb:.0f} MB of memory, the server's limit for one "
                    "run: try a smaller block size")
        if time.perf_counter() - self.started > self.limit_s:
            return f"the run did not end within the server's limit of {self.limit_s:.0f} s and was ended"
        return ""
