"""What every stage script shares: `run_stage(name, sections, inputs, body)`.

    1. validate: the params sections the stage reads (and run), and that every input exists -- a problem is one
       line on stderr and exit code 2, before any compute, any MLflow run or any output
    2. numerics and threads: agentrl.core.numerics.enter(run.threads, run.numerics) pins the CPU kernels and sets the
       thread count, the stage's only such setting, before torch is imported
    3. one writer: the stage's lock (agentrl.pipeline.lock; a second process waits, then one line naming the holder)
    4. one MLflow run (agentrl.tracking.run.stage_run): provenance hashed, store probed, run opened
    5. body(ctx) computes and writes the stage's outputs; a user-fixable failure inside it (a corrupted input, a
       diverged run) is again one line and exit code 2, and the run is marked FAILED
    6. what it read, read again: params and inputs that changed while it ran stop it here, before its provenance
       record, with its outputs put back (agentrl.pipeline.unchanged), so DVC records nothing

All of it runs inside the error boundary (agentrl.core.boundary): an unexpected exception is one line and a log file
(exit 1), Ctrl-C exits 130, SIGTERM 143, SIGHUP 129 and SIGQUIT 131, with the run marked KILLED; on any failure
the outputs DVC removed before running the stage are put back (agentrl.pipeline.restore) and SystemExit carries the
code.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from agentrl.core.boundary import check_threads, guard
from agentrl.core.config import UserError, section_values
from agentrl.pipeline.lock import stage_lock
from agentrl.pipeline.restore import restore_outputs


@dataclass
class StageContext:
    name: str
    params: dict          # section -> validated config object
    run: object           # agentrl.tracking.run.StageRun

    @property
    def seed(self) -> int:
        return self.params["run"].seed

    @property
    def threads(self) -> int:
        return self.params["run"].threads


def read_keys(values: dict, keys: list[str]) -> dict:
    """The keys of a section a stage reads; "key.entry" keeps only that entry of a mapping-valued key."""
    out: dict = {}
    for key in keys:
        head, _, entry = key.partition(".")
        if head not in values:
            continue
        if entry:
            out.setdefault(head, {})[entry] = values[head].get(entry)
        else:
            out[head] = values[head]
    return out


def run_stage(name: str, sections: list[str], inputs: list, body, numeric: bool = True,
              params_path: str = "params.yaml", only: dict | None = None, sources: dict | None = None,
              numerics: str | None = None, extra: dict | None = None) -> None:
    """Validate, set threads, open the stage's MLflow run, call body(ctx). `only` restricts which keys of a section
    count as read (logged and hashed), e.g. an ablation instance reads ablate.steps but not the list of seeds that
    generates the instances; "arms.kl" keeps one entry of a mapping (the instance's own arm). `sources` says where
    inputs came from (input -> package, version, hashes), recorded in provenance and MLflow. `numerics`: the mode
    this stage runs under when it is not run.numerics (a lab's own; agentrl.core.lab_config.stage_mode). `extra`:
    params -> what the stage read beyond its sections' keys, by section (a lab's seed and its config with its base
    resolved), logged and hashed with them. Returns on success; raises SystemExit with the boundary's exit code
    otherwise."""
    entry(name, _run_stage, name, sections, inputs, body, numeric, params_path, only, sources, numerics, extra)


def entry(name: str, fn, *args) -> None:
    """fn(*args) inside the error boundary; on failure the outputs DVC removed before running the stage are put back
    (agentrl.pipeline.restore), then SystemExit with the boundary's exit code (also for what a stage script does
    before run_stage, e.g. finding its matrix instance)."""
    code = guard(name, fn, *args)
    if code:
        restore_outputs()
        sys.exit(code)


PARENT_POLL = 1.0   # seconds between looks at the process that ran the stage


def watch_parent(interval: float = PARENT_POLL) -> None:
    """Under DVC: when the DVC process that runs this stage ends (SIGTERM to `dvc exp exec-run`, SIGKILL to `dvc
    repro`), the stage ends KILLED saying so, instead of writing on into a workspace nothing will record (a queued
    experiment's temporary copy is deleted as its DVC process ends: the stage then failed on a missing directory)."""
    import threading
    import time
    parent = os.getppid()

    def loop():
        while os.getppid() == parent:
            time.sleep(interval)
        from agentrl.core.boundary import terminate_self
        terminate_self(f"the DVC process that ran it, pid {parent}, ended")
    threading.Thread(target=loop, daemon=True, name="agentrl-parent-watch").start()


def logged_params(params: dict, only: dict | None, extra) -> dict:
    """The values a stage logs and hashes as read: each section's (restricted by `only`), and `extra(params)`."""
    logged = {s: section_values(s, p) for s, p in params.items()}
    for section, keys in (only or {}).items():
        logged[section] = read_keys(logged[section], keys)
    for section, values in (extra(params) if extra else {}).items():
        logged[section] = {**logged[section], **values}
    return logged


def _run_stage(name, sections, inputs, body, numeric, params_path, only, sources=None, numerics=None,
               extra=None) -> None:
    from agentrl.core.config import load_params
    from agentrl.pipeline.unchanged import OutputSnapshot, check_unchanged
    from agentrl.tracking.provenance import work_root
    wanted = list(dict.fromkeys((["run"] if numeric else []) + list(sections)))
    params = load_params(wanted, params_path)
    missing = [str(p) for p in inputs if not Path(p).exists()]
    if missing:
        raise UserError(f"missing input {missing[0]}: run the stage that produces it (dvc repro)")
    machine = None
    if numeric:  # CPU numerics and threads, once, before any tensor work (agentrl.core.numerics)
        from agentrl.core.numerics import enter
        check_threads(params["run"].threads)
        machine = enter(params["run"].threads, numerics or params["run"].numerics)
    from agentrl.tracking.run import stage_run
    if os.environ.get("DVC_STAGE"):
        watch_parent()
    logged = logged_params(params, only, extra)
    threads = params["run"].threads if numeric else None  # a stage without tensor work has no thread count
    with stage_lock(name), stage_run(name, params=logged, inputs=[str(p) for p in inputs], threads=threads,
                                     machine=machine, sources=sources) as run:
        snapshot = OutputSnapshot(name, work_root())   # inside the lock: no other writer of these outputs
        body(StageContext(name, params, run))
        check_unchanged(name, logged, lambda: logged_params(load_params(wanted, params_path), only, extra),
                        run.record["inputs"], work_root(), snapshot)
