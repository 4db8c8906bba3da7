"""The docs name only what exists. Every module path, dotted name, class and function that docs/*.md and the README
name in backticks is looked up in the code, and docs/design.md's table of layers lists every module of each
package, no more and no fewer.

What a backticked span is taken for:
  - a path under the project (`agentrl/rl/trainer.py`, `backends/base.py`, `rl/rollout.sample_episodes`, `core/`):
    the file or folder exists (a short path is under agentrl/), and a name after the module is defined in it;
  - a dotted name starting at agentrl or one of its packages (`core.registry.Registry`, `agentrl.rl.trainer.train`):
    the module exists and defines (or imports) each name after it; one starting at a params section
    (`rl.clip_eps`) is a key of that section;
  - a class-like name (`EpisodeRecord`, `BackendSpec.thresholds`, `TinyAgent(kernels=...)`): a class or name the
    code defines, and the attribute after it one of its members;
  - a call (`sampler(pad_id)`): a function or method the code defines;
  - a constant-like name (`USES`, `KL_KINDS`, `AGENTRL_DEBUG=1`): a name, attribute or string the code holds.
Anything else (commands, values, output) is prose. Names of other software a doc quotes are listed in
OTHER_SOFTWARE, and a call of the standard library's system interface (`setrlimit(...)`) is its.
"""
from __future__ import annotations

import ast
import builtins
import os
import re
import resource
import signal
import socket
from functools import cache
from pathlib import Path

import pytest

from agentrl.core.config import SECTIONS, section_keys

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
PACKAGES = sorted(p.name for p in (REPO / "agentrl").iterdir() if p.is_dir() and (p / "__init__.py").exists())
CHECKED_ROOTS = ("agentrl/", "stages/", "tests/", "docs/", "reports/", ".ci/")
FOLDERS = {p.name for p in (REPO / "agentrl").rglob("*") if p.is_dir() and p.name != "__pycache__"}
SYSTEM_CALLS = set(dir(os)) | set(dir(socket)) | set(dir(resource)) | set(dir(signal))
OTHER_SOFTWARE = {
    # /proc/<pid>/status fields the sandbox's test reads (docs/sandbox.md)
    "CapAmb", "CapEff", "CapPrm", "NoNewPrivs", "Seccomp", "Uid",
    # Ray's and DVC's own names (docs/sweep.md, docs/dvc.md)
    "NodeDiedError", "Repo.status",
    # verl's and TRL's functions that docs/research.md compares the objective with
    "compute_policy_loss", "compute_policy_loss_gspo",
    # Ray's token variable (docs/sweep.md)
    "RAY_AUTH_TOKEN",
}


def spans(doc: Path) -> list[tuple[int, str]]:
    """(line, text) of each inline code span outside fenced blocks."""
    out, fenced = [], False
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out += [(number, m.group(1)) for m in re.finditer(r"`([^`]+)`", line)]
    return out


# ---------------------------------------------------------------- what the code defines

def _members(tree: ast.AST) -> set[str]:
    """Names a module or class body binds: definitions, assignments, imports, and (in a class) `self.x = ...`."""
    names = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            names |= {e.id for t in node.targets if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(tree, ast.ClassDef):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return names


@cache
def module_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@cache
def code_index() -> tuple[dict[str, set[str]], set[str], str]:
    """(class or name -> its members, every function and method name, all code text)."""
    classes: dict[str, set[str]] = {}
    functions: set[str] = set()
    texts = []
    for path in sorted([*REPO.glob("agentrl/**/*.py"), *REPO.glob("stages/*.py"), *REPO.glob("tests/*.py")]):
        if path == Path(__file__):
            continue   # its own lists of names
        tree = module_tree(path)
        texts.append(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, set()).update(_members(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        classes.setdefault(t.id, set())
    for path in sorted(REPO.glob("agentrl/**/*.[ch]*")):
        if path.suffix in (".cpp", ".h"):
            text = path.read_text()
            texts.append(text)
            functions |= set(re.findall(r'm\.def\("(\w+)"', text))
    texts.append((REPO / "Makefile").read_text())
    return classes, functions, "\n".join(texts)


def module_path(parts: list[str]) -> tuple[Path | None, list[str]]:
    """The longest module (a .py file or a package's __init__.py) the parts name under the repository, and the names
    after it."""
    for i in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:i])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate, parts[i:]
    return None, parts


def defines(module: Path, names: list[str]) -> bool:
    """The module binds names[0], and (a class) each further name is a member."""
    if not names:
        return True
    scope: ast.AST = module_tree(module)
    for name in names:
        if name not in _members(scope):
            return False
        scope = next((n for n in ast.iter_child_nodes(scope) if isinstance(n, ast.ClassDef) and n.name == name), None)
        if scope is None:
            return name == names[-1]
    return True


# ---------------------------------------------------------------- what a span names

CALL = re.compile(r"^([A-Za-z_][\w.]*)\(.*\)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
CLASS_LIKE = re.compile(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*(\.[A-Za-z_]\w*)?$")
CONSTANT = re.compile(r"^([A-Z][A-Z0-9]*_[A-Z0-9_]+|[A-Z]{4,})(=\S*)?$")
_stems = [p for p in REPO.glob("agentrl/**/*.py") if p.stem != "__init__"]
MODULE_STEMS = {p.stem: p for p in _stems if [q.stem for q in _stems].count(p.stem) == 1 and p.stem not in PACKAGES
                and p.stem != "stage"}   # `stage.instance` is an MLflow tag, `stage.save` DVC's
FILE_SUFFIXES = {"py", "pt", "json", "md", "yaml", "lock", "png", "csv", "txt", "db", "cpp", "h"}
PATH = re.compile(r"^\.?[\w-]+(/[\w.-]*)+$")


def problem(text: str) -> str | None:
    """Why the span names something that does not exist (None: it exists, or it is prose)."""
    classes, functions, code = code_index()
    text = text.strip()
    if text in OTHER_SOFTWARE or any(c in text for c in "<>*${}"):
        return None
    call = CALL.match(text)
    name = call.group(1) if call else text
    if PATH.match(name) and (name.split("/")[0] in ("agentrl", "stages", "tests", "docs", "reports", ".ci",
                                                      *FOLDERS) or name.endswith((".py", ".md", ".cpp", ".h"))):
        return _path_problem(name)
    if DOTTED.match(name) and name.rsplit(".", 1)[1] in FILE_SUFFIXES:
        return None   # a file's name (`preflight.json`)
    head, second = name.split(".")[:2] if DOTTED.match(name) else (None, None)
    if head in SECTIONS and not module_path(["agentrl", head, second])[1] == []:
        return None if second in section_keys(head) else f"params section {head} has no key {second}"
    if DOTTED.match(name) and name.split(".")[0] in MODULE_STEMS:   # `objectives.clip_objective`
        module, rest = MODULE_STEMS[name.split(".")[0]], name.split(".")[1:]
        return None if defines(module, rest) else f"{module.relative_to(REPO)} defines no {'.'.join(rest)}"
    if DOTTED.match(name) and name.split(".")[0] in ("agentrl", *PACKAGES):
        parts = name.split(".")
        module, rest = module_path(parts if parts[0] == "agentrl" else ["agentrl", *parts])
        if module is None:
            return f"no module {name}"
        return None if defines(module, rest) else f"{module.relative_to(REPO)} defines no {'.'.join(rest)}"
    if CLASS_LIKE.match(name) and name.split(".")[0] not in dir(builtins):
        head, _, member = name.partition(".")
        if head not in classes:
            return f"no class or name {head}"
        return None if not member or member in classes[head] else f"{head} has no member {member}"
    if call and "." not in name and name not in dir(builtins) and name not in SYSTEM_CALLS:
        return None if name in functions else f"no function {name}"
    if CONSTANT.match(text):
        word = CONSTANT.match(text).group(1)
        return None if re.search(rf"\b{word}\b", code) else f"the code holds no {word}"
    return None


def _path_problem(name: str) -> str | None:
    if name.startswith(("data/", "/", "-", ".dvc/")):
        return None   # generated data, DVC's own folder and the machine's files
    if name.endswith("/") and name.count("/") == 1 and name[:-1] in FOLDERS:
        return None   # a folder of agentrl by its own name (`sandbox/`)
    full = name if name.startswith(CHECKED_ROOTS) else f"agentrl/{name}"
    if (REPO / full).exists():
        return None
    folder, _, leaf = full.rpartition("/")
    stem, _, names = leaf.partition(".")   # "rollout.sample_episodes": a name in rl/rollout.py
    module = REPO / folder / f"{stem}.py"
    if not module.is_file():
        return f"no file or folder {full}"
    if names in ("", "py") or defines(module, names.split(".")):
        return None
    return f"{module.relative_to(REPO)} defines no {names}"


# a stale name in a page being rewritten elsewhere: (page, span) -> why it stays for now. The test fails once the
# page no longer holds the span, so the entry goes with the fix.
KNOWN_STALE = {
    ("docs/performance.md", "MIN_ROWS"): "the bullet on MKL's small-M path predates the fixed kernels",
    ("docs/performance.md", "packing.rowwise"): "the same bullet",
    ("docs/performance.md", "policy.cached"): "a profile's entries of an earlier layout (now Block.cached)",
    ("docs/performance.md", "cache.append"): "the same profile (KVCache.append)",
}


def test_every_module_class_and_function_the_docs_name_exists():
    found = [(f"{doc.relative_to(REPO)}", line, text, why) for doc in DOCS for line, text in spans(doc)
             if (why := problem(text))]
    missing = [f"{page}:{line}: `{text}`: {why}" for page, line, text, why in found
               if (page, text) not in KNOWN_STALE]
    assert missing == [], "\n".join(missing)
    assert {(page, text) for page, _, text, _ in found} >= set(KNOWN_STALE), "fixed: remove it from KNOWN_STALE"


# ---------------------------------------------------------------- design.md's table of layers

def layer_table() -> dict[str, set[str]]:
    """docs/design.md's layer table: package -> the modules its row lists. A row of one package lists its modules
    (`name`, `sub/` (`a`, `b`) for a subpackage's, `name.cpp` for a source of another language); a row of several
    gives each as `pkg/`: its modules; the `top` row lists agentrl's own modules (package "")."""
    rows: dict[str, set[str]] = {}
    for line in (REPO / "docs" / "design.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        packages = re.findall(r"`(\w+)/`", cells[1]) or [""]
        tokens = [name or paren for name, paren in re.findall(r"`([\w.]+/?)`|([()])", cells[2])]
        current, folders = packages[0], []
        for i, token in enumerate(tokens):
            if token == ")":
                folders.pop()
            elif token.endswith("/") and i + 1 < len(tokens) and tokens[i + 1] == "(":
                folders.append(token)
            elif token.endswith("/") and not folders and token[:-1] in packages:
                current = token[:-1]
            elif token != "(":
                rows.setdefault(current, set()).add("".join(folders) + token)
    return rows


def package_modules(package: str) -> set[str]:
    """A package's modules as the table names them: folder-relative, without .py; sources of other languages with
    their suffix; __init__ files are the package itself ("": agentrl's own modules)."""
    root = REPO / "agentrl" / package
    out = set()
    for path in (root.glob("*.py") if not package else root.rglob("*")):
        if path.suffix == ".py" and path.stem != "__init__":
            out.add(path.relative_to(root).with_suffix("").as_posix())
        elif path.suffix in (".cpp", ".h"):
            out.add(path.relative_to(root).as_posix())
    return out


@pytest.mark.parametrize("package", ["", *PACKAGES])
def test_design_md_lists_every_module_of_each_package(package):
    table = layer_table()
    assert package in table, f"docs/design.md's layer table has no row for {package}/"
    listed, actual = table[package], package_modules(package)
    assert (sorted(actual - listed), sorted(listed - actual)) == ([], []), "(not listed, listed but absent)"
