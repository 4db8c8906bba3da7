"""The code closure follows the registry: a module a stage loads by name (a backend, an environment) is in its deps,
its provenance hash and its audit, and a stage that loads code outside its deps fails instead of recording a
provenance that misses it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from agentrl.tracking.closure import code_closure, used_modules
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


def test_without_its_uses_the_closure_misses_the_backend(tmp_path):
    """The teeth: the same stage without its USES line has no static import of backends/tinyagent.py."""
    root = copy_code(tmp_path)
    script = root / "stages" / "train.py"
    assert used_modules(script, root) == {"agentrl.backends.tinyagent", "agentrl.env.gym.spec"}
    script.write_text("\n".join(line for line in script.read_text().splitlines() if not line.startswith("USES")))
    assert used_modules(script, root) == set()
    assert BACKEND not in code_closure("stages/train.py", root)


def test_an_unknown_uses_entry_is_one_line(tmp_path):
    root = copy_code(tmp_path)
    script = root / "stages" / "train.py"
    script.write_text(script.read_text().replace('"backends": ["tinyagent"]', '"backends": ["llama"]'))
    with pytest.raises(ValueError, match="USES: backends 'llama' is not built in; allowed: tinyagent, hf"):
        code_closure("stages/train.py", root)


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


def test_a_registry_made_with_its_module_is_an_import_of_that_module(tmp_path):
    """Registry(kind, field, module) imports `module` when a knob is validated: the closure follows it, whether
    the module is a literal or a module-level name (fault injection: without the edge the file is missing)."""
    from agentrl.tracking.closure import code_closure
    (tmp_path / "agentrl" / "core").mkdir(parents=True)
    (tmp_path / "stages").mkdir()
    for f in ("agentrl/__init__.py", "agentrl/core/__init__.py", "agentrl/variants.py", "agentrl/other.py"):
        (tmp_path / f).write_text("")
    (tmp_path / "agentrl/core/knobs.py").write_text(
        'MOD = "agentrl.variants"\nA = Registry("a", "x.a", MOD)\nB = Registry("b", "x.b", module="agentrl.other")\n')
    (tmp_path / "stages/s.py").write_text("from agentrl.core import knobs\n")
    files = code_closure("stages/s.py", tmp_path)
    assert {"agentrl/variants.py", "agentrl/other.py", "agentrl/core/knobs.py"} <= set(files)
    (tmp_path / "agentrl/core/knobs.py").write_text('A = "agentrl.variants"\n')
    assert "agentrl/variants.py" not in code_closure("stages/s.py", tmp_path)


def test_every_stage_closure_has_the_modules_its_params_validation_loads():
    from agentrl.core import config
    from agentrl.tracking.closure import code_closure
    modules = {r.module for r in vars(config).values() if isinstance(r, config.Registry) and r.module}
    assert "agentrl.rl.objectives" in modules
    files = set(code_closure("stages/ablate_summary.py", REPO))
    assert {m.replace(".", "/") + ".py" for m in modules} <= files
