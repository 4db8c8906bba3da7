"""A stage script's code: the agentrl modules it imports, transitively (imports inside functions included), with the
packages they live in, and the source files they compile. `python -m agentrl deps` rewrites the code entries of
every stage's deps in dvc.yaml from it (data deps, params and outs are left as they are); tests/test_dvc_yaml.py
checks the result independently.

A registered entry (a backend, an environment) is code like any other: a stage names the entries it uses as the
objects their modules register (`USES = (TINYAGENT, GYM)`), so their modules are imports of the stage, and the
registries of the variants a knob names (agentrl.core.variants) are filled by the modules the stage imports. A
registry imports a module by name only when an entry it declares is looked up without being imported; a stage that
does so loads a module outside its closure and fails when it ends (agentrl.tracking.run), naming the file.

A module that compiles source files of its own at run time (C++) names them, relative to its folder, in a
module-level literal `COMPILES = ["fixed.cpp"]`; they join the closure as code (`is_code`).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from agentrl.core import files

CODE_SUFFIXES = (".py", ".cpp", ".h")   # what a stage's deps hold as code (the rest are inputs)


def is_code(path: str) -> bool:
    return path.endswith(CODE_SUFFIXES)


def compiled_sources(path: Path) -> list[str]:
    """The files a module's module-level `COMPILES = [...]` literal names (none without one)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "COMPILES" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def _imports(path: Path, root: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "agentrl":
            found.add(node.module)
            for alias in node.names:
                if (root / node.module.replace(".", "/") / f"{alias.name}.py").exists():
                    found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "agentrl"}
    return found


def _file(module: str, root: Path) -> str:
    path = module.replace(".", "/")
    return f"{path}.py" if (root / f"{path}.py").exists() else f"{path}/__init__.py"


def code_closure(script: str, root: Path | str = ".") -> list[str]:
    """The stage script and every agentrl file it needs, sorted (the script first)."""
    root = Path(root)
    files, todo = {"agentrl/__init__.py"}, [script]
    package = Path(script).parent / "__init__.py"   # `python -m stages.x` runs stages/__init__.py first
    if package.as_posix() != "__init__.py" and (root / package).exists():
        files.add(package.as_posix())
        todo.append(package.as_posix())
    while todo:
        current = todo.pop()
        for source in compiled_sources(root / current):
            files.add((Path(current).parent / source).as_posix())
        for module in _imports(root / current, root):
            f = _file(module, root)
            parts = f.split("/")[:-1]
            for g in {f} | {"/".join(parts[:i]) + "/__init__.py" for i in range(1, len(parts) + 1)}:
                if g not in files and (root / g).exists():
                    files.add(g)
                    todo.append(g)
    return [script] + sorted(files)


def rewrite_dvc_yaml(root: Path | str = ".") -> list[str]:
    """Replace the code entries (is_code) of each stage's deps in dvc.yaml with its code closure; returns changed
    stages."""
    root = Path(root)
    text = files.read_text(root / "dvc.yaml", files.MAX_TEXT_BYTES, "dvc.yaml")
    changed = []
    out, stage, in_deps = [], None, False
    for line in text.splitlines():
        m = re.match(r"^  (\w+):\s*$", line)
        if m:
            stage, in_deps = m.group(1), False
        if stage and line.strip() == "deps:" and line.startswith("    deps"):
            in_deps = True
            out.append(line)
            closure = code_closure(f"stages/{stage}.py", root)
            out += [f"    - {f}" for f in closure]
            continue
        if in_deps:
            if line.startswith("    - "):
                if is_code(line.strip()[2:]):
                    continue
            else:
                in_deps = False
        out.append(line)
    new = "\n".join(out) + "\n"
    if new != text:
        changed = ["dvc.yaml"]
        (root / "dvc.yaml").write_text(new)
    return changed
