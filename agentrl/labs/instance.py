"""Which lab a process runs, and where it writes: a recipe at a seed.

    a committed recipe   an entry of params.yaml's lab.configs (its base chain resolved), at a seed: stage
                         lab@<lab>-<seed>, reports/labs/<lab>/seed<N>.{json,md}
    an explored recipe   a config file reports/labs/explored/<recipe>/config.yaml (its keys, or base: <a committed
                         recipe> and the keys it changes), at a seed: stage lab@explored.<recipe>-<seed>, its reports
                         beside the file (seed<N>.{json,md})

Every random stream of a lab derives from its seed; the same recipe at several seeds is pooled by `study labs` by
name and seed. Under DVC the instance comes from $DVC_STAGE (lab.runs x lab.seeds), never from a shell.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agentrl.core.artifacts import DATA, REPORTS
from agentrl.core.knobs import ConfigError, UserError

LABS_DIR = REPORTS / "labs"
EXPLORED_DIR = LABS_DIR / "explored"
CONFIG_FILE = "config.yaml"


@dataclass(frozen=True)
class LabInstance:
    name: str                       # the recipe: a lab.configs entry, or an explored recipe's directory
    seed: int
    spec: dict                      # the keys it runs with (base chain resolved)
    config_file: str | None = None  # the explored recipe's config.yaml it was read from

    @property
    def explored(self) -> bool:
        return self.config_file is not None

    @property
    def stage(self) -> str:
        """Its stage instance: the provenance record's, the MLflow run's and the stage lock's name."""
        return f"lab@{'explored.' if self.explored else ''}{self.name}-{self.seed}"

    @property
    def home(self) -> Path:
        """The recipe's directory of reports."""
        return (EXPLORED_DIR if self.explored else LABS_DIR) / self.name

    @property
    def report(self) -> Path:
        """reports/labs/<lab>/seed<N> (add .json or .md)."""
        return self.home / f"seed{self.seed}"

    @property
    def work_dir(self) -> Path:
        """Checkpoints and kept progress (data/labs/<lab>/seed<N>, not committed)."""
        return DATA / "labs" / ("explored" if self.explored else "") / self.name / f"seed{self.seed}"

    @property
    def model_dir(self) -> Path:
        """The stage's model output: the small random-init Qwen3 it made, or a note of the directory it loaded."""
        return DATA / "models" / f"lab-{'explored.' if self.explored else ''}{self.name}-{self.seed}"

    def logged(self, lab) -> dict:
        """The lab section as this instance read it (logged, hashed, compared by audit): the settings every lab
        shares, its seed and its resolved config (and the file it came from)."""
        out = {"device": lab.device, "eval_batch": lab.eval_batch, "seed": self.seed,
               "configs": {self.name: self.spec}}
        return {**out, "config_file": self.config_file} if self.explored else out


def from_params(lab, name: str, seed: int) -> LabInstance:
    """lab.configs.<name> at `seed` (lab: the validated lab section)."""
    from agentrl.core.lab_config import config_run, resolve
    if name not in lab.configs:
        raise UserError(f"--lab: unknown value {name[:80]!r}; allowed: {', '.join(map(str, lab.configs))}")
    config_run(lab.configs, name)
    return LabInstance(name, seed, resolve(lab.configs, name))


def from_file(lab, path: str | Path, seed: int) -> LabInstance:
    """An explored recipe's config file at `seed`: reports/labs/explored/<recipe>/config.yaml, inside this tree."""
    from agentrl.core.lab_config import LAB_NAME, lab_run, read_config_file, resolve_spec
    path = Path(path)
    try:
        rel = path.resolve().relative_to(Path.cwd().resolve()) if path.is_absolute() else Path(os.path.normpath(path))
    except ValueError:
        rel = path
    if rel.name != CONFIG_FILE or rel.parent.parent != EXPLORED_DIR or not LAB_NAME.fullmatch(rel.parent.name):
        raise ConfigError(f"--config: {str(path)[:120]}: a recipe's config is {EXPLORED_DIR}/<recipe>/{CONFIG_FILE} "
                          "(<recipe>: letters, digits and _); its reports are written beside it")
    name, where = rel.parent.name, f"{rel}"
    spec = resolve_spec(read_config_file(rel), lab.configs, where)
    lab_run(name, spec, where)
    return LabInstance(name, seed, spec, rel.as_posix())


def named(lab, name: str | None, config: str | None, seed: int | None) -> LabInstance:
    """The instance flags name: --lab NAME or --config FILE, at --seed (default 0)."""
    if (name is None) == (config is None):
        raise UserError("lab: name the recipe with --lab NAME (an entry of lab.configs) or --config FILE (an explored "
                        f"recipe's {EXPLORED_DIR}/<recipe>/{CONFIG_FILE}), one of them")
    seed = 0 if seed is None else seed
    from agentrl.core.rl_config import SEED_MAX
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise UserError(f"--seed: expected an integer in [0, {SEED_MAX}], got {str(seed)[:40]}")
    return from_file(lab, config, seed) if config is not None else from_params(lab, name, seed)


def load_named(name: str | None, config: str | None, seed: int | None) -> tuple[dict, LabInstance]:
    """(params' run, rl and lab sections, the recipe at its seed) that a lab verb's flags name; the rl section is
    validated against the registered variants, so the package that registers them is imported here."""
    from agentrl.core.config import load_params
    from agentrl.rl import variants  # noqa: F401
    params = load_params(["run", "rl", "lab"])
    return params, named(params["lab"], name, config, seed)
