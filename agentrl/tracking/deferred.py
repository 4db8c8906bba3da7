"""Deferred runs, for a stage run on a node that cannot reach the store (`python -m agentrl sweep`): with
$AGENTRL_TRACKING_DEFER naming a directory, a stage's run is recorded there instead (`Recorder`: the calls a
`StageRun` makes, kept as JSON and files), and `replay_run` later logs it into the project's store and writes its
provenance record."""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from agentrl.core import files
from agentrl.core.boundary import signals_blocked
from agentrl.tracking.orphans import close_all_orphans, process_tag
from agentrl.tracking.provenance import git_info, project_root
from agentrl.tracking.records import record_path, write_index, write_record
from agentrl.tracking.store import (
    DEFAULT_EXPERIMENT,
    _client,
    _ensure_experiment,
    _retry,
    artifact_location,
    configured_uri,
    log_artifact,
    probe,
    tracking_uri,
)
from agentrl.tracking.values import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VALUE,
    _chunks,
    _key,
    _value_text,
)

DEFER_ENV = "AGENTRL_TRACKING_DEFER"


def unblocked(seconds: float) -> None:
    """A wait between two attempts to create a run, during which a signal acts (no run exists then)."""
    with signals_blocked(False):
        time.sleep(seconds)


class Recorder:
    """The subset of MlflowClient a `StageRun` calls, recording into a directory instead of a store: `run.json`
    (tags, params, metrics, status, times; written when the run ends) and `artifacts/<artifact path>/...`."""

    RUN_ID = "deferred"

    def __init__(self, directory: Path | str):
        self.dir = Path(directory)
        self.run: dict = {"params": {}, "tags": {}, "metrics": [], "artifacts": [], "status": "RUNNING"}

    def create_run(self, experiment_id, run_name: str, tags: Mapping, start_time: int | None = None):
        from types import SimpleNamespace
        self.run.update(name=run_name, start_time=start_time or int(time.time() * 1000))
        self.run["tags"].update(tags)
        return SimpleNamespace(info=SimpleNamespace(run_id=self.RUN_ID, artifact_uri=None))

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.run["metrics"] += [[m.key, m.value, m.timestamp, m.step] for m in metrics]
        self.run["params"].update({p.key: p.value for p in params})
        self.run["tags"].update({t.key: t.value for t in tags})

    def set_tag(self, run_id, key: str, value: str):
        self.run["tags"][key] = value

    def log_artifact(self, run_id, local_path: str, artifact_path: str | None = None):
        import shutil
        dest = self.dir / "artifacts" / (artifact_path or "")
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(local_path, dest / Path(local_path).name)
        self.run["artifacts"].append([Path(artifact_path or "", Path(local_path).name).as_posix(), artifact_path])

    def log_artifacts(self, run_id, local_dir: str, artifact_path: str | None = None):
        for path in sorted(p for p in Path(local_dir).rglob("*") if p.is_file()):
            parent = path.parent.relative_to(local_dir).as_posix()
            sub = "/".join(x for x in (artifact_path, "" if parent == "." else parent) if x)
            self.log_artifact(run_id, str(path), sub or None)

    def set_terminated(self, run_id, status: str = "FINISHED"):
        self.run.update(status=status, end_time=int(time.time() * 1000))
        write_record(self.dir / "run.json", self.run)


def replay_run(directory: Path | str, tags: Mapping | None = None, root: Path | str | None = None,
               experiment: str = DEFAULT_EXPERIMENT) -> str:
    """Log a run a `Recorder` kept in `directory` into the project's store (with extra `tags`, e.g. the sweep id)
    and, for a finished run, write its provenance record where the stage itself would have (the driver's commit and
    the new run id filled in). Returns the run id."""
    directory, root = Path(directory), Path(root).resolve() if root is not None else project_root()
    kept = json.loads(files.read_text(directory / "run.json", files.MAX_RECORD_BYTES, "a kept run"))
    uri = tracking_uri(root)
    probe(uri)
    client = _client(uri)
    exp_id = _ensure_experiment(client, uri, experiment, artifact_location(uri, root))
    close_all_orphans(client, "the replay of a deferred run")
    git = git_info(root)
    run_tags = {**kept["tags"], **(tags or {}), "git.commit": git["commit"], "git.dirty": str(git["dirty"]).lower(),
                "process": process_tag()}
    run_tags.pop("workdir", None)
    if git["commit"] != "unknown":
        run_tags["mlflow.source.git.commit"] = git["commit"]
    status, run = "KILLED", None
    try:
        with signals_blocked():   # from the run's creation until this block owns it, a signal waits
            run = _retry(client.create_run, exp_id, start_time=kept["start_time"], run_name=kept["name"],
                         tags={_key(k): _value_text(v, MAX_TAG_VALUE) for k, v in run_tags.items()}, wait=unblocked)
        _replay_into(client, run, kept, directory, uri, root, experiment, git, run_tags.get("pipeline_run", ""))
        status = kept["status"]
    finally:
        if run is not None:
            with signals_blocked():
                _retry(client.set_terminated, run.info.run_id, status, end_time=kept.get("end_time"))
    return run.info.run_id


def _replay_into(client, run, kept: dict, directory: Path, uri: str, root: Path, experiment: str, git: dict,
                 pipeline_run: str) -> None:
    from mlflow.entities import Metric, Param
    run_id = run.info.run_id
    for chunk in _chunks([Param(k, v) for k, v in sorted(kept["params"].items())], MAX_PARAMS_TAGS_PER_BATCH):
        _retry(client.log_batch, run_id, params=chunk)
    for chunk in _chunks([Metric(*m) for m in kept["metrics"]], MAX_METRICS_PER_BATCH):
        _retry(client.log_batch, run_id, metrics=chunk)
    for rel, artifact_path in kept["artifacts"]:
        if artifact_path == "provenance":
            record = json.loads(files.read_text(directory / "artifacts" / rel, files.MAX_RECORD_BYTES,
                                                "a kept provenance record"))
            record.update(git_commit=git["commit"], dirty=git["dirty"], pipeline_run=pipeline_run)
            record["mlflow"].update(run_id=run_id, experiment=experiment, tracking_uri=configured_uri())
            path = record_path(record["stage"], root)
            write_record(path, record)
            write_index(path.parent)
            log_artifact(client, run_id, run.info.artifact_uri, uri, path, "provenance")
        else:
            log_artifact(client, run_id, run.info.artifact_uri, uri, directory / "artifacts" / rel, artifact_path)
