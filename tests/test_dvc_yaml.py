"""dvc.yaml declares exactly what each stage runs: its script, the agentrl modules it imports (transitively,
including imports inside functions, and the packages they live in) and nothing else of the code; each stage's
params are keys it reads; every report output survives a failed stage; the named plots exist."""
import ast
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def agentrl_imports(path: Path) -> set[str]:
    """agentrl modules a file imports anywhere in its body (a registered entry a stage uses is one: it names the
    entry as the object its module registers)."""
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


def packages_of(file: str) -> set[str]:
    """The __init__.py of every package a module file lives in (Python imports them first)."""
    parts = file.split("/")[:-1]
    return {"/".join(parts[:i]) + "/__init__.py" for i in range(1, len(parts) + 1)} - {file}


def run_time_sources(file: str) -> set[str]:
    """The files an agentrl module reads as code at run time (its COMPILES, read off the imported module)."""
    import importlib
    if not file.startswith("agentrl/"):
        return set()
    module = importlib.import_module(file.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    return {str(Path(file).parent / s) for s in getattr(module, "COMPILES", ())}


def code_closure(script: str) -> set[str]:
    """The script's agentrl imports, transitively, and its package's __init__ (`python -m stages.x` runs it first:
    it pins the CPU numerics) with what that imports, and the source files those modules compile."""
    files, todo = {"agentrl/__init__.py", "stages/__init__.py"}, [script, "stages/__init__.py"]
    while todo:
        current = todo.pop()
        files |= run_time_sources(current)
        for module in agentrl_imports(REPO / current):
            f = module_file(module)
            for g in {f} | packages_of(f):
                if g not in files:
                    files.add(g)
                    todo.append(g)
    return files


def dvc():
    return yaml.safe_load((REPO / "dvc.yaml").read_text())


def stages():
    return dvc()["stages"]


def test_code_deps_are_exactly_the_import_closure():
    for name, stage in stages().items():
        script = f"stages/{name}.py"
        declared = {d for d in stage["deps"] if d.endswith((".py", ".cpp", ".h"))}
        assert declared == {script} | code_closure(script), name


def test_the_report_depends_on_no_model_code():
    """The report renders stage outputs: none of rl/, model/, env/, eval/ or faults/ is in its closure, but for the
    modules that register the variants the knobs name (validating every params section reads their names) and what
    they import."""
    registered = code_closure("agentrl/rl/variants.py") | {"agentrl/rl/variants.py"}
    deps = set(stages()["report"]["deps"]) - registered
    assert not [d for d in deps if re.match(r"agentrl/(rl|model|env|eval|faults)/", d)], sorted(deps)
    assert "agentrl/rl/objectives.py" in registered and "agentrl/rl/variants.py" in stages()["report"]["deps"]


def test_every_stage_script_is_a_stage_and_runs_as_a_module():
    scripts = {p.stem for p in (REPO / "stages").glob("*.py")} - {"__init__"}
    assert scripts == set(stages())
    for name, stage in stages().items():
        assert stage["cmd"].startswith(f"python -m stages.{name}"), name


def test_params_are_keys_the_stage_reads_and_threads_feed_every_numeric_stage():
    import importlib
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for name, stage in stages().items():
        module = importlib.import_module(f"stages.{name}")
        reads = getattr(module, "READS", {})
        declared = set()
        for p in stage["params"]:
            section, *key = p.split(".")
            assert section in params and (not key or key[0] in params[section]), (name, p)
            declared.add(p)
            if key and section in reads:
                assert key[0] in reads[section], (name, p, "declared but not read")
        matrix = " ".join(map(str, (stage.get("matrix") or {}).values()))
        for section in getattr(module, "SECTIONS", []):   # every section a stage loads is a param of it (whole or
            assert any(d == section or d.startswith(f"{section}.") for d in declared) or \
                f"${{{section}." in matrix, (name, section)   # some keys), unless it only names the instances
        for section, keys in reads.items():   # every key a stage reads is declared (so DVC reruns it)
            for k in keys:   # "ablate.arms.${item.arm}" declares the instance's own entry of ablate.arms
                assert section in declared or f"{section}.{k}" in declared or \
                    any(d.startswith(f"{section}.{k}.${{item.") for d in declared), (name, section, k)
        numeric = "numeric=False" not in (REPO / "stages" / f"{name}.py").read_text()
        if numeric:   # a stage with tensor work reruns when the thread count or the CPU numerics change
            assert any(p in ("run", "run.threads") for p in stage["params"]), name
            assert any(p in ("run", "run.numerics") for p in stage["params"]), name


def test_reports_are_uncached_and_persist_and_no_store_inside_outputs():
    for name, stage in stages().items():
        for entry in stage.get("outs", []) + stage.get("metrics", []) + stage.get("plots", []):
            path, opts = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
            if path.startswith("reports"):
                assert opts.get("cache") is False and opts.get("persist") is True, (name, path)
            else:
                assert path.startswith("data/"), (name, path)
            assert "mlflow" not in path and "mlartifacts" not in path and "provenance" not in path


def test_metrics_are_small_and_plots_are_named():
    metrics = [next(iter(m)) if isinstance(m, dict) else m for s in stages().values() for m in s.get("metrics", [])]
    assert all(m.startswith("reports/metrics/") for m in metrics), metrics
    names = {next(iter(p)) for p in dvc()["plots"]}
    assert {"training_reward", "validation_pass", "heldout_per_arm", "entropy", "approx_kl",
            "zero_adv_share"} <= names
    outs = {next(iter(o)) if isinstance(o, dict) else o for s in stages().values() for o in s.get("outs", [])}
    for plot in dvc()["plots"]:
        (name, spec), = plot.items()
        assert spec["x"] and all(f in outs for f in spec["y"]), name


def test_the_report_knows_which_stage_writes_each_input():
    from agentrl.report.compute import WRITTEN_BY
    for file, stage in WRITTEN_BY.items():
        outs = {next(iter(o)) if isinstance(o, dict) else o for o in stages()[stage]["outs"]}
        assert file in outs, (file, stage)


def test_dvc_sends_no_analytics_from_the_project_or_a_tests_own_repository(tmp_path, monkeypatch):
    """The project's .dvc/config turns analytics off for a user's commands; a repository a test makes with `dvc init`
    has no such line, so the test session sets DVC_NO_ANALYTICS, which every DVC it starts inherits."""
    import os

    from dvc.analytics import is_enabled
    assert os.environ.get("DVC_NO_ANALYTICS") == "1"   # set by conftest for the whole session
    monkeypatch.delenv("DVC_NO_ANALYTICS")
    monkeypatch.delenv("DVC_TEST", raising=False)
    monkeypatch.chdir(REPO)
    assert not is_enabled()
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[core]\n    no_scm = True\n")   # what `dvc init --no-scm` writes
    monkeypatch.chdir(tmp_path)
    assert is_enabled()   # what a bare `dvc init` gives: why the session's variable is needed
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    assert not is_enabled()
