"""The architecture the code should show: one concept per module (none over 450 lines), imports that only point
down the layers -- by an import statement or by name (`importlib.import_module`, `__import__`, a dotted module name
in a string, such as a registry's declared module) --, no import cycles, and every module importable on its own.
The stage scripts (stages/) are the top layer: nothing in agentrl/ imports one."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "agentrl"
PACKAGES = ("agentrl", "stages")   # the code the layers order (stages/ on top)
MAX_LINES = 450
# bottom to top; a module may import its own layer and the layers below it, never above
LAYERS = [
    ["agentrl.core", "agentrl"],
    ["agentrl.tracking"],
    ["agentrl.env"],
    ["agentrl.model"],
    ["agentrl.backends"],
    ["agentrl.rl"],
    ["agentrl.starting", "agentrl.eval"],
    ["agentrl.faults"],
    ["agentrl.labs"],
    ["agentrl.report"],
    ["agentrl.studies", "agentrl.bench", "agentrl.pipeline"],
    ["agentrl.cli", "agentrl.__main__"],
    ["stages"],
]

def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            out[name] = path
    return out


def layer(module: str) -> int:
    best, rank = -1, None
    for i, names in enumerate(LAYERS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank is not None, f"{module} is in no layer"
    return rank


def imports(path: Path) -> set[str]:
    """agentrl and stages modules a file imports anywhere (module level or inside functions)."""
    mods = modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in PACKAGES}
    return {m for m in found if m in mods}


# the modules that import a module whose name they are handed (never a literal of their own), and why that is safe
LOADS_BY_NAME = {
    "agentrl.core.registry": "a registry's declared module, a string checked here where it is declared",
    "agentrl.env.coding.sandbox.interpreter": "the sandboxed program's own imports (never an agentrl module)",
}
DYNAMIC_IMPORTS = {"import_module", "__import__"}


def named_imports(path: Path) -> tuple[set[str], list[str]]:
    """(the agentrl modules a file names by string: a dotted name in any string literal -- a registry's declared
    module, an import_module or __import__ argument --; the lines of dynamic imports whose argument is no literal)."""
    mods = modules()
    named, unnamed = set(), []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in mods \
                and node.value not in PACKAGES:   # a bare "stages" is a directory's name, not an import
            named.add(node.value)
        elif isinstance(node, ast.Call):
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if fn in DYNAMIC_IMPORTS and not (node.args and isinstance(node.args[0], ast.Constant)):
                unnamed.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return named, unnamed


def test_no_module_over_the_size_limit():
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}


def upward_imports(mods: dict[str, Path]) -> list[tuple[str, str]]:
    return [(m, t) for m, p in mods.items() for t in imports(p)
            if layer(t) > layer(m) and not (m == "agentrl" or t == "agentrl")]


def test_imports_only_point_down():
    assert upward_imports(modules()) == []


def test_an_import_of_a_stage_from_the_library_is_caught(tmp_path):
    """The check has teeth across the two trees: a lab module importing a stage script (labs sit below stages)."""
    planted = tmp_path / "direct.py"
    planted.write_text((PKG / "labs" / "direct.py").read_text() + "\nfrom stages.lab import SECTIONS\n")
    assert upward_imports({"agentrl.labs.direct": planted}) == [("agentrl.labs.direct", "stages.lab")]


def test_modules_named_by_string_only_point_down():
    """A module named in a string is an import all the same (a registry imports it on first lookup): it may name
    only its own layer and those below. Cycles through such names are how a registry works (the registry names the
    module, the module registers into the registry), so only the direction is checked."""
    upward, loaders = [], []
    for m, p in modules().items():
        named, unnamed = named_imports(p)
        upward += [(m, t) for t in named if layer(t) > layer(m)]
        if unnamed and m not in LOADS_BY_NAME:
            loaders += unnamed
    assert upward == [] and loaders == []


def test_import_graph_is_acyclic():
    graph = {m: {t for t in imports(p) if t != m and t != "agentrl"} for m, p in modules().items()}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for t in graph.get(m, ()):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack + [m, t]))
            if not state.get(t):
                visit(t, stack + [m])
        state[m] = 2
    for m in graph:
        if not state.get(m):
            visit(m, [])


@pytest.mark.slow   # one fresh interpreter per module (torch and MLflow imports each time)
def test_every_module_imports_on_its_own():
    """Each module imported into an interpreter holding no other agentrl module (third-party imports stay cached,
    so this takes seconds)."""
    names = sorted(n for n in modules() if n != "agentrl.__main__")
    code = ("import importlib, sys\n"
            f"names = {names!r}\n"
            "bad = []\n"
            "for name in names:\n"
            "    for m in [m for m in sys.modules if m == 'agentrl' or m.startswith('agentrl.')]:\n"
            "        del sys.modules[m]\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except Exception as exc:\n"
            "        bad.append((name, repr(exc)))\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
