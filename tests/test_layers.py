"""The package's layers, computed from its own imports: no import cycle between modules, and no
module imports from a layer above its own.

Layers, bottom to top (README "Layout"):

    base        errors, streams, native (the one door to the _native extension)
    runtime     llama.cpp engine, GGUF inspection, ABI check, default model, fingerprint
    memory      bank, budget, codecs, store          (beside runtime: neither imports the other)
    method      templates, extraction, ingest pipeline, retrieval, steering, presets
    facade      miita.py (the Miita class)
    evaluation  the continual-learning harness
    serve       the OpenAI-compatible server (beside evaluation)
    app         cli.py, demo/, the package __init__

Every ``import`` and ``from ... import`` counts, wherever it stands (a function-local import is
still a dependency). A package's ``__init__`` is not counted as imported when one of its
submodules is: Python runs it first, but that is the package's face, not a dependency of the
importer (the top-level ``__init__`` re-exports the public names from every layer).
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

LAYERS = {
    "base": ("errors", "streams", "native", "_native"),
    "runtime": ("runtime",),
    "memory": ("memory",),
    "method": ("method",),
    "facade": ("miita",),
    "evaluation": ("evaluation",),
    "serve": ("serve",),
    "app": ("cli", "demo", "steering_check", "__init__", "__main__"),
}
ALLOWED = {
    "base": {"base"},
    "runtime": {"base", "runtime"},
    "memory": {"base", "memory"},
    "method": {"base", "runtime", "memory", "method"},
    "facade": {"base", "runtime", "memory", "method", "facade"},
    "evaluation": {"base", "runtime", "memory", "method", "facade", "evaluation"},
    "serve": {"base", "runtime", "memory", "method", "facade", "serve"},
    "app": set(LAYERS),
}


def package_dir() -> Path:
    """The package's source files: the checkout's python/miita_edge, else the installed copy
    (found without importing it, so this test needs no compiled extension)."""
    here = Path(__file__).resolve().parent.parent / "python" / "miita_edge"
    if (here / "__init__.py").is_file():
        return here
    spec = importlib.util.find_spec("miita_edge")
    assert spec is not None and spec.origin, "miita_edge is neither in the checkout nor installed"
    return Path(spec.origin).parent


def module_graph(root: Path, top: str) -> dict[str, set[str]]:
    """{module: modules of the same package it imports}, from the source of every .py file."""
    modules: dict[str, Path] = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        modules[".".join([top] + parts)] = f
    names = set(modules)

    def package_of(mod: str) -> str:
        return mod if modules[mod].name == "__init__.py" else mod.rpartition(".")[0]

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, f in modules.items():
        tree = ast.parse(f.read_text("utf-8"), filename=str(f))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package_of(mod).split(".")
                    base = base[: len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                # ``from pkg import sub`` depends on the submodule; ``from mod import name`` on mod
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    is_module = sub in names or sub + ".__init__" in names or sub == f"{top}._native"
                    targets.append(sub if is_module else src)
            for t in targets:
                if not (t == top or t.startswith(top + ".")):
                    continue
                if t.endswith(".__init__"):
                    t = t[: -len(".__init__")]
                if t in names:
                    graph[mod].add(t)
                elif t + ".__init__" in names:
                    graph[mod].add(t + ".__init__")
                elif t == f"{top}._native":
                    graph[mod].add(t)
    return graph


def layer_of(mod: str, top: str) -> str:
    first = mod[len(top) + 1:].split(".")[0] if mod != top else "__init__"
    for layer, members in LAYERS.items():
        if first in members:
            return layer
    raise AssertionError(f"module {mod} is in no layer: add its top-level name to LAYERS in {__file__}")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {m: WHITE for m in graph}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        color[m] = GREY
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if n not in color:
                continue
            if color[n] == GREY:
                return stack[stack.index(n):] + [n]
            if color[n] == WHITE:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        color[m] = BLACK
        return None

    for m in sorted(graph):
        if color[m] == WHITE:
            found = visit(m)
            if found:
                return found
    return None


def upward_imports(graph: dict[str, set[str]], top: str) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        lm = layer_of(mod, top)
        for d in sorted(deps):
            ld = layer_of(d, top)
            if ld not in ALLOWED[lm]:
                bad.append(f"{mod} ({lm}) imports {d} ({ld})")
    return bad


def test_the_package_graph_is_real():
    graph = module_graph(package_dir(), "miita_edge")
    assert len(graph) >= 30, sorted(graph)
    # spot checks that the parser sees relative, nested and function-local imports
    assert "miita_edge.runtime.engine" in graph["miita_edge.miita"]
    assert "miita_edge.errors" in graph["miita_edge.memory.store"]
    assert "miita_edge.miita" in graph["miita_edge.evaluation.methods"]  # a function-local import


def test_no_import_cycles():
    cycle = find_cycle(module_graph(package_dir(), "miita_edge"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_upward_imports():
    bad = upward_imports(module_graph(package_dir(), "miita_edge"), "miita_edge")
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


@pytest.fixture
def fake_pkg(tmp_path):
    root = tmp_path / "miita_edge"
    for rel, text in {
        "__init__.py": "from .miita import X\n",
        "errors.py": "",
        "miita.py": "from .memory.bank import B\nX = 1\n",
        "memory/__init__.py": "",
        "memory/bank.py": "def f():\n    from ..miita import X\n",  # upward, and a cycle
        "runtime/__init__.py": "",
        "runtime/engine.py": "from ..errors import E\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel and text)
    return root


def test_the_checks_catch_a_cycle_and_an_upward_import(fake_pkg):
    graph = module_graph(fake_pkg, "miita_edge")
    assert graph["miita_edge.memory.bank"] == {"miita_edge.miita"}
    assert graph["miita_edge.runtime.engine"] == {"miita_edge.errors"}
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"miita_edge.miita", "miita_edge.memory.bank"}
    assert upward_imports(graph, "miita_edge") == ["miita_edge.memory.bank (memory) imports miita_edge.miita (facade)"]


# ---------------------------------------------------------------- sizes: one job per module and function

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120


def oversized(root: Path, top: str) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and functions (methods, nested ones too) over
    MAX_FUNCTION_LINES, counted with ast from the ``def`` line to the function's last line."""
    bad = []
    for f in sorted(root.rglob("*.py")):
        rel = ".".join([top] + list(f.relative_to(root).with_suffix("").parts))
        text = f.read_text("utf-8")
        n = len(text.splitlines())
        if n > MAX_MODULE_LINES:
            bad.append(f"module {rel}: {n} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, filename=str(f))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    bad.append(f"function {rel}.{node.name} (line {node.lineno}): {length} lines "
                               f"(at most {MAX_FUNCTION_LINES})")
    return bad


def test_modules_and_functions_stay_small():
    bad = oversized(package_dir(), "miita_edge")
    assert not bad, "split by responsibility:\n" + "\n".join(bad)


def test_the_size_check_counts_lines_and_functions(tmp_path):
    root = tmp_path / "miita_edge"
    root.mkdir()
    (root / "__init__.py").write_text("")
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))  # def line + 120 = 121 lines
    (root / "big.py").write_text("def f():\n" + body + "\n\nclass C:\n    def g(self):\n        return 1\n")
    (root / "long.py").write_text("\n" * (MAX_MODULE_LINES + 1))
    (root / "ok.py").write_text("def h():\n" + "".join(f"    y{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1)))
    assert oversized(root, "miita_edge") == [
        f"function miita_edge.big.f (line 1): {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})",
        f"module miita_edge.long: {MAX_MODULE_LINES + 1} lines (at most {MAX_MODULE_LINES})"]
