"""The code closure follows the registered entries a stage uses: it names them as objects (`USES`), imported from
the modules that register them, so those modules are in its deps, its provenance hash and its audit; the closure is
the stage's imports and reads no registry's source; and a stage that loads code outside its deps (an entry looked
up by name without its import) fails instead of recording a provenance that misses it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from agentrl.tracking.closure import code_closure
from agentrl.tracking.provenance import code_hash, loaded_unlisted, stage_code_files

REPO = Path(__file__).resolve().parents[1]
BACKEND = "agentrl/backends/tinyagent.py"


def copy_code(dest: Path) -> Path:
    for name in ("agentrl", "stages"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, dest / name)
    return dest


def test_train_depends_on_the_backend_it_loads_through_the_registry():
    deps = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["train"]["deps"]
    assert BACKEND in deps and "agentrl/env/gym/spec.py" in deps
    assert BACKEND in code_closure("stages/train.py", REPO)
    assert "agentrl/backends/hf.py" not in deps   # only what it uses: the HF backend is the labs'


def test_the_stage_names_its_entries_as_the_objects_their_modules_register():
    import stages.train
    from agentrl.backends.registry import BACKENDS
    from agentrl.env.registry import ENVIRONMENTS
    assert stages.train.USES == (BACKENDS["tinyagent"], ENVIRONMENTS["gym"])


def test_without_the_import_of_its_entry_the_closure_misses_the_backend(tmp_path):
    """The teeth: the same stage naming its backend only by name has no import of backends/tinyagent.py (the run
    would then load it through the registry and fail at its end: the next test)."""
    root = copy_code(tmp_path)
    script = root / "stages" / "train.py"
    text = script.read_text()
    assert "from agentrl.backends.tinyagent import TINYAGENT\n" in text
    script.write_text(text.replace("from agentrl.backends.tinyagent import TINYAGENT\n", "")
                      .replace("USES = (TINYAGENT, GYM)", "USES = (GYM,)").replace("TINYAGENT.name", '"tinyagent"'))
    assert BACKEND not in code_closure("stages/train.py", root)
    assert "agentrl/env/gym/spec.py" in code_closure("stages/train.py", root)


def test_the_closure_reads_no_registry_source(tmp_path):
    """A registry's declared modules are not edges: a stage importing only the registry has none of them."""
    root = copy_code(tmp_path)
    (root / "stages" / "probe.py").write_text("from agentrl.backends.registry import backend\n")
    files = code_closure("stages/probe.py", root)
    assert "agentrl/backends/registry.py" in files and BACKEND not in files and "agentrl/backends/hf.py" not in files


def test_editing_the_backend_moves_trains_code_hash(tmp_path):
    root = copy_code(tmp_path)
    files = stage_code_files("train", root)
    assert BACKEND in files
    before = code_hash(files, root)
    (root / BACKEND).write_text((root / BACKEND).read_text() + "# an edit\n")
    assert code_hash(files, root) != before
    (root / "agentrl" / "backends" / "qwen3.py").write_text("# not train's code\n")
    assert code_hash(stage_code_files("train", root), root) == code_hash(files, root) != before


def test_a_stage_that_loads_code_outside_its_deps_is_caught(monkeypatch):
    """loaded_unlisted lists the agentrl files a stage process loaded that its deps lack (only in a stage process)."""
    files = stage_code_files("train", REPO)
    import agentrl.backends.tinyagent  # noqa: F401  (loaded, as a stage loading it through the registry would)
    assert loaded_unlisted(files, REPO) == []   # not a stage process: the test runner imports what it likes
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", types.SimpleNamespace(name="stages.train"),
                        raising=False)
    assert BACKEND not in loaded_unlisted(files, REPO)
    unlisted = loaded_unlisted([f for f in files if f != BACKEND], REPO)
    assert BACKEND in unlisted


@pytest.mark.slow
def test_dvc_status_and_audit_name_the_backend(tmp_path):
    """In a clone of the committed tree: dvc status reports train changed once backends/tinyagent.py is edited (and
    not before), and `audit` of a train metric lists the file among the code that produced it."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    dvc = [str(Path(sys.executable).parent / "dvc"), "status", "train"]

    def changed_deps() -> str:
        out = subprocess.run(dvc, cwd=clone, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert BACKEND not in changed_deps()
    (clone / BACKEND).write_text((clone / BACKEND).read_text() + "# an edit\n")
    assert f"modified:           {BACKEND}" in changed_deps()
    audit = subprocess.run([sys.executable, "-m", "agentrl", "audit", "reports/metrics/train.json:validation_last",
                            "--json"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert audit.returncode in (0, 1), audit.stderr
    assert BACKEND in json.loads(audit.stdout)["code"]


def test_a_stage_that_validates_rl_knobs_imports_what_registers_their_variants():
    """core names no module above it: the knob's allowed values are whatever the process has registered, so every
    stage that validates an rl section (or an arm's rl overrides) has the registering modules in its closure."""
    import importlib

    from agentrl.core import variants as registries
    registering = {f"{fn.__module__.replace('.', '/')}.py"
                   for registry in (registries.OBJECTIVE + (registries.KEEP_MODES, registries.LR_SCHEDULES,
                                                            registries.CURRICULA))
                   for _, fn in registry.items()}
    assert "agentrl/rl/objectives.py" in registering and "agentrl/rl/curriculum.py" in registering
    for script in sorted(p for p in (REPO / "stages").glob("*.py") if p.stem != "__init__"):
        if {"rl", "ablate"} & set(importlib.import_module(f"stages.{script.stem}").SECTIONS):
            missing = registering - set(code_closure(f"stages/{script.stem}.py", REPO))
            assert not missing, (script.stem, missing)


VALIDATE = """
import importlib, sys
from agentrl.core.config import load_params
stage = importlib.import_module("stages." + sys.argv[1])
load_params(list(dict.fromkeys(["run"] + list(stage.SECTIONS))), "params.yaml")
"""


@pytest.mark.slow   # a process per stage
def test_each_stage_validates_its_sections_with_what_it_imports_at_the_top():
    """In a fresh process, what a stage module imports before its body runs is enough to validate its params
    sections (run_stage validates them before the body, which may import more): a registry knob whose variants only
    the body would register is the refusal `no KL estimator is registered in this process`."""
    scripts = sorted(p.stem for p in (REPO / "stages").glob("*.py") if p.stem != "__init__")
    procs = {s: subprocess.Popen([sys.executable, "-c", VALIDATE, s], cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for s in scripts}
    failed = {s: p.communicate(timeout=300)[1].strip().splitlines()[-1:] for s, p in procs.items()}
    assert {s: err for s, err in failed.items() if procs[s].returncode != 0} == {}
