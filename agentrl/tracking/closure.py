"""A stage script's code: the agentrl modules it imports, transitively (imports inside functions included), with the
packages they live in, and the modules of the registered entries it uses. `python -m agentrl deps` rewrites the
code entries of every stage's deps in dvc.yaml from it (data deps, params and outs are left as they are);
tests/test_dvc_yaml.py checks the result independently.

A module that compiles source files of its own at run time (C++) names them, relative to its folder, in
a module-level literal `COMPILES = ["fixed.cpp"]`; they join the closure as code (`is_code`).

A module that loads a backend or an environment by name (agentrl.core.registry) says which in a module-level
literal, `USES = {"backends": ["tinyagent"], "environments": ["gym"]}`; the closure follows each name to the module
its registry's `BUILTIN` map declares for it. A `Registry(kind, field, module)` made with the module that registers
its entries (the objective's variants, imported when a knob is validated) is an import of that module. A stage that
loads a module outside its closure fails when it ends (agentrl.tracking.run), so the closure cannot silently miss
code.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from agentrl.core import files

CODE_SUFFIXES = (".py", ".cpp", ".h")   # what a stage's deps hold as code (the rest are inputs)


def is_code(path: str) -> bool:
    return path.endswith(CODE_SUFFIXES)


# the registries whose built-in entries live in modules of their own: USES key -> the file declaring BUILTIN
REGISTRY_FILES = {"backends": "agentrl/backends/registry.py", "environments": "agentrl/env/registry.py",
                  "benches": "agentrl/bench/__init__.py"}


def _module_literal(path: Path, name: str):
    """The value of a module-level `name = <literal>` in a file, or None."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return ast.literal_eval(node.value)
    return None


def used_modules(path: Path, root: Path) -> set[str]:
    """The modules of the registered entries a file names in its `USES`."""
    uses = _module_literal(path, "USES") or {}
    found = set()
    for kind, names in uses.items():
        if kind not in REGISTRY_FILES:
            raise ValueError(f"{path}: USES: unknown registry {kind!r}; allowed: {', '.join(REGISTRY_FILES)}")
        builtin = _module_literal(root / REGISTRY_FILES[kind], "BUILTIN") or {}
        for name in names:
            if name not in builtin:
                raise ValueError(f"{path}: USES: {kind} {name!r} is not built in; allowed: {', '.join(builtin)}")
            found.add(builtin[name])
    return found


def _registry_module(node: ast.Call, path: Path) -> str | None:
    """The module a `Registry(kind, field, module)` call imports on first use (a literal or a module-level name)."""
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
    if name != "Registry":
        return None
    arg = node.args[2] if len(node.args) > 2 else next((k.value for k in node.keywords if k.arg == "module"), None)
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        value = _module_literal(path, arg.id)
        return value if isinstance(value, str) else None
    return None


def _imports(path: Path, root: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            module = _registry_module(node, path)
            if module and module.split(".")[0] == "agentrl":
                found.add(module)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "agentrl":
            found.add(node.module)
            for alias in node.names:
                if (root / node.module.replace(".", "/") / f"{alias.name}.py").exists():
                    found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "agentrl"}
    return found | used_modules(path, root)


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
        for source in _module_literal(root / current, "COMPILES") or ():
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
