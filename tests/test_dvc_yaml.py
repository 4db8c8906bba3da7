"""dvc.yaml declares exactly what each stage runs: its script, the agentrl modules it imports (transitively,
including imports inside functions) and nothing else of the code; each stage's params are sections it reads."""
import ast
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def agentrl_imports(path: Path) -> set[str]:
    """agentrl modules a file imports anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "agentrl":
            found.add(node.module)
            for alias in node.names:
                if (REPO / node.module.replace(".", "/") / f"{alias.name}.py").exists():
                    found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "agentrl"}
    return found


def module_file(module: str) -> str:
    path = module.replace(".", "/")
    return f"{path}.py" if (REPO / f"{path}.py").exists() else f"{path}/__init__.py"


def code_closure(script: str) -> set[str]:
    files, todo = {"agentrl/__init__.py"}, [script]
    while todo:
        for module in agentrl_imports(REPO / todo.pop()):
            f = module_file(module)
            if f not in files:
                files.add(f)
                todo.append(f)
    return files


def stages():
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def test_code_deps_are_exactly_the_import_closure():
    for name, stage in stages().items():
        script = f"stages/{name}.py"
        declared = {d for d in stage["deps"] if d.endswith(".py")}
        assert declared == {script, "stages/__init__.py"} | code_closure(script), name


def test_every_stage_script_is_a_stage_and_runs_as_a_module():
    scripts = {p.stem for p in (REPO / "stages").glob("*.py")} - {"__init__"}
    assert scripts == set(stages())
    for name, stage in stages().items():
        assert stage["cmd"].startswith(f"python -m stages.{name}"), name


def test_params_sections_exist_and_threads_feed_every_numeric_stage():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for name, stage in stages().items():
        for p in stage["params"]:
            section, *key = p.split(".")
            assert section in params and (not key or key[0] in params[section]), (name, p)
        numeric = name != "tasks"
        assert numeric == any(p in ("run", "run.threads") for p in stage["params"]), name


def test_reports_are_uncached_and_no_store_inside_outputs():
    for name, stage in stages().items():
        for entry in stage.get("outs", []) + stage.get("metrics", []) + stage.get("plots", []):
            path, opts = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
            if path.startswith("reports"):
                assert opts.get("cache") is False, (name, path)
            else:
                assert path.startswith("data/"), (name, path)
            assert "mlflow" not in path and "mlartifacts" not in path
