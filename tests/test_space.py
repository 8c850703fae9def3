"""The repository deploys as a Hugging Face Space as it stands: the front matter, requirements.txt
(no test tools), and a simulated Space start from a fresh `git clone` that serves the page."""
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPACE_ENV = {  # what a Space sets (gradio reads SYSTEM / SPACE_ID / GRADIO_SERVER_*; the rest are HF's helpers)
    "SYSTEM": "spaces", "SPACE_ID": "mars-test/mars-playground", "SPACE_AUTHOR_NAME": "mars-test",
    "SPACE_REPO_NAME": "mars-playground", "SPACE_TITLE": "MARS Playground", "CPU_CORES": "2", "MEMORY": "16Gi",
    "SPACE_HOST": "mars-test-mars-playground.hf.space", "GRADIO_SERVER_NAME": "0.0.0.0", "PYTHONUNBUFFERED": "1",
}
DEV_ONLY = ("pytest", "playwright")


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.match(r"\A---\n(.*?)\n---\n", text, re.S)
    assert block, "README.md must open with the Space's YAML front matter"
    return dict(re.match(r"(\w+):\s*\"?([^\"]*)\"?$", line).groups() for line in block.group(1).splitlines())


def pins(name: str) -> dict:
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_space_configuration():
    meta = front_matter()
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py" and (ROOT / meta["app_file"]).is_file()
    runtime = pins("requirements.txt")
    assert meta["sdk_version"] == runtime["gradio"], "the Space's gradio must be the pinned one"
    assert not set(DEV_ONLY) & set(runtime), "test tools must not be installed on a Space"
    dev = (ROOT / "requirements-dev.txt").read_text(encoding="utf-8").splitlines()
    assert "-r requirements.txt" in dev and set(DEV_ONLY) <= set(pins("requirements-dev.txt"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = readme.split("<!-- ci:install -->", 1)[1].split("```bash\n", 1)[1].splitlines()[0]
    assert install == "pip install -r requirements-dev.txt"  # the README's command installs the tests' needs


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no obstacle
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port")


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode("utf-8")


def test_a_space_starts_from_a_fresh_clone(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout to clone from")
    clone = tmp_path / "space"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    port = free_port(7860)
    print(f"simulated Space on port {port}" + ("" if port == 7860 else " (7860 was busy)"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MARS_MODEL", "AR_MODEL")}
    env.update(SPACE_ENV, GRADIO_SERVER_PORT=str(port), HF_HUB_OFFLINE="1")
    # The real pair is prepared in the background; here the registry is unreachable and the cache
    # empty, so the page must serve at once and nothing is downloaded (the offline case).
    env.update(MARS_CACHE=str(tmp_path / "cache"), PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0",
               PIP_TIMEOUT="2", PIP_CONFIG_FILE=os.devnull)
    log = open(tmp_path / "app.log", "w")
    app = subprocess.Popen([sys.executable, "app.py"], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        page, deadline = None, time.time() + 240
        while page is None and time.time() < deadline and app.poll() is None:
            try:
                page = fetch(f"http://127.0.0.1:{port}/")
            except OSError:
                time.sleep(1)
        output = (tmp_path / "app.log").read_text()
        assert page is not None, f"no page on port {port} (exit {app.poll()}):\n{output[-3000:]}"
        assert page.lstrip().lower().startswith("<!doctype html>")
        config = json.loads(fetch(f"http://127.0.0.1:{port}/config"))
        assert config["title"] == "MARS Playground"
        assert config["space_id"] == SPACE_ENV["SPACE_ID"]  # gradio saw the Space's variables
        assert f"0.0.0.0:{port}" in output and "tiny-mars-b4" in json.dumps(config)
        assert str(ROOT) not in json.dumps(config)  # served from the clone, and no server path shown
        time.sleep(5)  # long enough for the unreachable registry to answer
        output = (tmp_path / "app.log").read_text()
        # (gradio's own hot-reload watcher prints a traceback on a simulated Space without the
        # `spaces` package; none may come from our code, the real pair's thread included)
        assert "mars_core/" not in output and "playground/" not in output, output[-3000:]
        assert not list((tmp_path / "cache").rglob("*.whl"))
    finally:
        app.terminate()
        try:
            app.wait(timeout=30)
        except subprocess.TimeoutExpired:
            app.kill()
        log.close()


def test_every_decoding_handler_holds_a_zerogpu_slot_long_enough(monkeypatch):
    sys.path.insert(0, str(ROOT))
    import app

    seen = []

    def fake_gpu(fn=None, **kwargs):  # what spaces.GPU receives on a ZeroGPU Space
        seen.append((getattr(fn, "__name__", fn), kwargs))
        return fn

    monkeypatch.setattr(app, "GPU", fake_gpu)
    app.build_app(str(ROOT / "assets" / "models" / "tiny-mars-b4"), "", max_seconds=45)
    names = {name for name, _ in seen}
    assert {"generate", "run"} <= names and len(seen) >= 4, seen
    assert all(kw == {"duration": 75} for _, kw in seen)  # the decode's own limit, plus 30 s
