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
import re
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


# ---------------------------------------------------------------- private insides: Engine and Miita keep theirs
# Outside runtime/, code uses an Engine only through its public methods and properties; outside
# miita.py, nobody calls a private Miita method. Checked on the source text (strings included: the
# benches run child scripts written as strings), with names read from the two classes themselves.

#: A receiver named like an engine: any private attribute read on it is an Engine internal, even one
#: the Engine does not define (patching a new attribute onto an engine is touching its insides too).
ENGINE_RECEIVER = re.compile(r"^(eng|engine|\w+_engine|twin|sibling)$")
PRIVATE = re.compile(r"\.(_[A-Za-z]\w*)\b")


def engine_private_names(root: Path) -> set[str]:
    """The private names an engine carries: every ``self._x`` of class Engine (attributes, methods,
    properties) in runtime/engine.py, and every private attribute a runtime module assigns on
    another object (a sibling's owner, a key pass's kept rows)."""
    names: set[str] = set()
    for f in sorted((root / "runtime").glob("*.py")):
        tree = ast.parse(f.read_text("utf-8"), filename=str(f))
        for node in ast.walk(tree):
            if f.name == "engine.py" and isinstance(node, ast.ClassDef) and node.name == "Engine":
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_private(sub.name):
                        names.add(sub.name)
                    elif (isinstance(sub, ast.Attribute) and is_private(sub.attr)
                          and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                        names.add(sub.attr)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        if (isinstance(sub, ast.Attribute) and is_private(sub.attr)
                                and not (isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"))):
                            names.add(sub.attr)
    return names


def miita_private_methods(root: Path) -> set[str]:
    """The private methods (and properties) of class Miita in miita.py."""
    tree = ast.parse((root / "miita.py").read_text("utf-8"))
    return {sub.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "Miita"
            for sub in node.body if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_private(sub.name)}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(text: str, names: set[str], calls_only: bool = False,
                 receiver: re.Pattern | None = None) -> list[str]:
    """``line: expression`` for each ``X._name`` in ``text`` whose name is in ``names`` (with
    ``calls_only``, only ``X._name(``), or whose receiver's last identifier matches ``receiver``;
    a bare ``self`` or ``cls`` receiver is a class's own business and never counts."""
    found = []
    for m in PRIVATE.finditer(text):
        before = re.search(r"(\.?)(\w*)\s*$", text[:m.start()])
        recv = before.group(2)
        if recv in ("self", "cls") and not before.group(1):
            continue
        if calls_only and not re.match(r"\s*\(", text[m.end():]):
            continue
        if m.group(1) in names or (receiver is not None and receiver.match(recv)):
            shown = recv or text[max(0, m.start() - 1):m.start()]  # ``f(x)._name``: ")._name"
            found.append(f"{text.count(chr(10), 0, m.start()) + 1}: {shown}.{m.group(1)}")
    return found


def sources_outside(root: Path, skip) -> list[Path]:
    """The package's modules (less ``skip``), the benches and the tests (less this file): what
    must keep off the two classes' insides. The benches and tests are there only in a checkout."""
    here = Path(__file__).resolve()
    files = [f for f in sorted(root.rglob("*.py")) if not skip(f.relative_to(root))]
    for d in (here.parent.parent / "bench", here.parent):
        files += [f for f in sorted(d.rglob("*.py")) if f.resolve() != here]
    return files


def private_engine_uses(root: Path) -> list[str]:
    names = engine_private_names(root)
    return [f"{f}:{hit}" for f in sources_outside(root, lambda rel: rel.parts[0] == "runtime")
            for hit in private_uses(f.read_text("utf-8"), names, receiver=ENGINE_RECEIVER)]


def private_miita_calls(root: Path) -> list[str]:
    names = miita_private_methods(root)
    return [f"{f}:{hit}" for f in sources_outside(root, lambda rel: rel == Path("miita.py"))
            for hit in private_uses(f.read_text("utf-8"), names, calls_only=True)]


def test_the_private_names_are_read_from_the_classes(tmp_path):
    assert {"_model", "_ctx", "_key_prefix", "_owner", "_siblings", "_closed", "_probe_graph",
            "_key_prefix_verdict"} <= engine_private_names(package_dir())
    root = tmp_path / "miita_edge"
    (root / "runtime").mkdir(parents=True)
    (root / "runtime" / "engine.py").write_text(
        "class Other:\n    def _no(self):\n        self._nor = 1\n"
        "class Engine:\n    def __init__(self):\n        self._a = 1\n    def _b(self):\n        return self._a\n")
    (root / "runtime" / "contexts.py").write_text("def f(sib, owner):\n    sib._c = 1\n    owner.x._d += 1\n")
    (root / "miita.py").write_text("class Miita:\n    def __init__(self): pass\n    def _e(self): pass\n"
                                   "    def f(self):\n        def _inner(): pass\n")
    assert engine_private_names(root) == {"_a", "_b", "_c", "_d"}
    assert miita_private_methods(root) == {"_e"}


def test_nothing_outside_runtime_touches_engine_internals():
    bad = private_engine_uses(package_dir())
    assert not bad, ("private Engine attributes used outside runtime/ (add a public Engine method or "
                     "property instead):\n" + "\n".join(bad))


def test_nothing_outside_miita_calls_a_private_miita_method():
    bad = private_miita_calls(package_dir())
    assert not bad, "private Miita methods called outside miita.py (make them public):\n" + "\n".join(bad)


def test_the_private_checks_catch_a_violation():
    src = ("def f(eng, m, store):\n"
           "    self._model = 1; cls._ctx = 2; store._read_current()\n"  # its own, and another class's
           "    x = m.engine._model + eng._anything\n"  # a known name; an engine-named receiver
           "    code = 'm._use_keys().query(t)'\n"  # a child script in a string
           "    m._use_keys\n"  # not a call
           "    return self.m._use_keys()\n")
    assert private_uses(src, {"_model", "_ctx"}, receiver=ENGINE_RECEIVER) == [
        "3: engine._model", "3: eng._anything"]
    assert private_uses(src, {"_use_keys"}, calls_only=True) == ["4: m._use_keys", "6: m._use_keys"]
    assert private_uses(src, {"_read_current"}) == ["2: store._read_current"]
