"""Floors only look down: each package imports only from the floors below it (README, "Layout").

    floor 4  app.py
    floor 3  playground/
    floor 2  training/  benchmarks/
    floor 1  mars_core/  tasks/

Read from the source with `ast`, so an import hidden inside a function counts too.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FLOOR = {"mars_core": 1, "tasks": 1, "training": 2, "benchmarks": 2, "playground": 3, "app": 4}


def _imports(path: pathlib.Path, package: str) -> set[str]:
    """Top-level names of our packages that `path` imports (relative imports resolve to its own)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(package if node.level else (node.module or "").split(".")[0])
    return found & set(FLOOR)


def _sources():
    for package in FLOOR:
        if package == "app":
            yield "app", ROOT / "app.py"
        else:
            for path in sorted((ROOT / package).rglob("*.py")):
                yield package, path


@pytest.mark.parametrize("package,path", list(_sources()), ids=lambda x: str(x).split("main/")[-1])
def test_no_import_runs_up_or_sideways(package, path):
    bad = {name for name in _imports(path, package)
           if name != package and FLOOR[name] >= FLOOR[package]}
    assert not bad, f"{path.relative_to(ROOT)} (floor {FLOOR[package]}) imports {sorted(bad)}"


def test_the_check_sees_a_violation(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("def f():\n    from training.evaluate import run_one\n")
    assert _imports(bad, "mars_core") == {"training"}
