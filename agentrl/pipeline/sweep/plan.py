"""What a sweep runs, asked of DVC: a matrix (or foreach) stage's instances, which of them are missing or stale
(exactly as `dvc status` says), what each reads and writes; and, once an instance's outputs are in place, its
record in dvc.lock (`dvc commit -f`, the same entry `dvc repro` writes)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentrl.core import files
from agentrl.core.config import UserError, read_params_file
from agentrl.pipeline.sweep.worker import CODE

CODE_DIRS = tuple(name for name in CODE if "." not in name)   # deps under these arrive with the shipped code


class SweepError(UserError):
    """Bad input to a sweep (unknown stage, no matrix, stale upstream, unreachable cluster): one line."""


@dataclass(frozen=True)
class Instance:
    name: str                 # ablate@default-0
    cmd: str                  # python -m stages.ablate (the instance: $DVC_STAGE, set to name)
    inputs: tuple[str, ...]   # data deps (files or directories), shipped as bytes
    outs: tuple[str, ...]     # what the instance writes, installed where `dvc repro` would
    threads: int              # run.threads: the CPUs one instance occupies


def check_stage(stage: str, root: Path) -> dict:
    """The dvc.yaml definition of a matrix stage; one line naming what is wrong otherwise."""
    import yaml
    try:
        stages = yaml.safe_load(files.read_text(root / "dvc.yaml", files.MAX_TEXT_BYTES, "dvc.yaml"))["stages"]
    except (OSError, yaml.YAMLError, KeyError, TypeError, files.InputFileError) as exc:
        raise SweepError(f"{root / 'dvc.yaml'}: cannot read the stage graph ({type(exc).__name__}); run sweep "
                         "from the repository root") from None
    matrices = [name for name, d in stages.items() if isinstance(d, dict) and ("matrix" in d or "foreach" in d)]
    if "@" in stage:
        raise SweepError(f"sweep takes a stage, not an instance: {stage.split('@', 1)[0]!r} "
                         f"(run one instance with dvc repro {stage})")
    if stage not in stages:
        raise SweepError(f"unknown stage {stage!r}; stages with a matrix: {', '.join(matrices) or 'none'}")
    if stage not in matrices:
        raise SweepError(f"stage {stage!r} has no matrix or foreach (nothing to spread): run it with dvc repro "
                         f"{stage}; stages with a matrix: {', '.join(matrices) or 'none'}")
    return stages[stage]


def _threads(stage, root: Path) -> int:
    """run.threads when the instance reads it (dvc.yaml params), else 1."""
    reads = [key for dep in stage.deps if type(dep).__name__ == "ParamsDependency" for key in (dep.params or [])]
    if not {"run", "run.threads"} & set(reads):
        return 1
    params = read_params_file(root / "params.yaml")
    threads = (params.get("run") or {}).get("threads", 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise SweepError(f"params.yaml run.threads: expected an integer >= 1, got {threads!r}")
    return threads


def plan(stage: str, root: Path | str = ".") -> tuple[list[Instance], list[Instance]]:
    """(every instance of `stage`, those that are missing or stale). Refuses when a stage upstream of them is not
    current: `dvc repro` would rebuild it first, so the instances would run on inputs about to change."""
    root = Path(root).resolve()
    check_stage(stage, root)
    from dvc.exceptions import DvcException
    from dvc.repo import Repo
    try:
        with Repo(str(root)) as repo:
            stages = [s for s in repo.index.stages if s.name.startswith(f"{stage}@")]
            status = repo.status(targets=[s.addressing for s in stages], with_deps=True) if stages else {}
    except DvcException as exc:
        raise SweepError(f"dvc: {str(exc).splitlines()[0]}") from None
    names = {s.addressing for s in stages}
    upstream = sorted(set(status) - names)
    if upstream:
        raise SweepError(f"stages upstream of {stage} are not current ({', '.join(upstream)}): run dvc repro "
                         f"{' '.join(upstream)} first")
    instances = []
    for s in stages:
        deps = [str(d.def_path) for d in s.deps if type(d).__name__ != "ParamsDependency"]
        inputs = tuple(d for d in deps if Path(d).parts[0] not in CODE_DIRS)
        instances.append(Instance(s.addressing, s.cmd, inputs, tuple(str(o.def_path) for o in s.outs),
                                  _threads(s, root)))
    return instances, [i for i in instances if i.name in status]


def commit(root: Path | str, name: str) -> None:
    """Record an instance whose outputs are complete in dvc.lock (and the DVC cache), as `dvc commit -f`."""
    import logging

    from dvc.repo import Repo
    quiet = logging.getLogger("dvc")
    level = quiet.level
    quiet.setLevel(logging.WARNING)   # not a line per instance about updating dvc.lock
    try:
        with Repo(str(Path(root).resolve())) as repo:
            repo.commit(name, force=True)
    finally:
        quiet.setLevel(level)
