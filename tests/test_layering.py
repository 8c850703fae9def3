"""Floors only look down: each package imports only from the floors below it (README, "Layout").

    floor 4  app.py
    floor 3  playground/
    floor 2  training/  benchmarks/
    floor 1  mars_core/  tasks/

Read from the source with `ast`, so an import hidden inside a function counts too, and so do
`importlib.import_module("x")` / `__import__("x")` with a literal name and relative imports
that climb out of their package (`from .. import training`).
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FLOOR = {"mars_core": 1, "tasks": 1, "training": 2, "benchmarks": 2, "playground": 3, "app": 4}


DYNAMIC = {"import_module", "__import__"}  # importlib.import_module, its bare import, the builtin


def _imports(path: pathlib.Path, package: str) -> set[str]:
    """Top-level names of our packages that `path` imports."""
    depth = len(path.relative_to(ROOT / package).parts) if package != "app" else 1  # packages around it
    return _imports_of(path.read_text(encoding="utf-8"), package, depth)


def _imports_of(source: str, package: str, depth: int = 1) -> set[str]:
    """Top-level names of our packages that `source` imports, for a module `depth` packages deep
    in `package` (1: directly in it). A relative import resolves to `package` unless it climbs
    above it: it then names what it imports from the root."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level >= depth + 1:  # out of the package
            found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom):
            found.add(package if node.level else (node.module or "").split(".")[0])
        elif isinstance(node, ast.Call) and _dynamic_name(node) is not None:
            name = _dynamic_name(node)
            found.add(package if name.startswith(".") else name.split(".")[0])
    return found & set(FLOOR)


def _dynamic_name(call: ast.Call) -> str | None:
    """The literal module name of an `import_module(...)` / `__import__(...)` call, else None."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name not in DYNAMIC or not call.args:
        return None
    arg = call.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


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


def test_the_check_sees_a_violation():
    assert _imports_of("def f():\n    from training.evaluate import run_one\n", "mars_core") == {"training"}


@pytest.mark.parametrize("source", [
    "import training.evaluate",
    "import numpy, training.evaluate as ev",
    "def f():\n    import importlib\n    return importlib.import_module('training.evaluate')",
    "from importlib import import_module\nimport_module('training')",
    "__import__('training.train')",
    "from .. import training",
    "from ..training import evaluate",
    "from ..training.evaluate import run_one",
])
def test_every_import_form_is_seen(source):
    assert _imports_of(source, "mars_core") == {"training"}


@pytest.mark.parametrize("source,depth,found", [
    ("from . import kv", 1, {"mars_core"}),
    ("from .kv import prefill", 1, {"mars_core"}),
    ("from .. import kv", 2, {"mars_core"}),  # a subpackage reaching its parent: still inside
    ("from ... import training", 2, {"training"}),
    ("import_module('.kv', 'mars_core')", 1, {"mars_core"}),
    ("import_module(name)", 1, set()),  # not a literal: nothing to check
    ("import torch, transformers", 1, set()),
])
def test_what_stays_inside_is_allowed(source, depth, found):
    assert _imports_of(source, "mars_core", depth) == found


def _module_imports(path: pathlib.Path) -> set[str]:
    """Dotted names of our modules that `path` imports (a function-level import counts too)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    package = parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            if node.module:  # `from . import x` names modules, not the package's own __init__
                found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import module`
    return {m for m in found if m.split(".")[0] in FLOOR}


def import_cycles() -> list[list[str]]:
    """Cycles in the graph of our modules' imports, each as a list of module names."""
    graph = {}
    for _, path in _sources():
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = _module_imports(path)
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_no_module_imports_itself_in_a_circle():
    """Not even through an import inside a function (build_default and model_card once did)."""
    assert import_cycles() == []
