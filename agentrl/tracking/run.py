"""One MLflow run per stage run, from start to a status that is never left RUNNING by a process that is gone.

`stage_run(stage, params, inputs, threads)` hashes the stage's provenance (fails before anything exists if an
input is missing), probes the store (one line naming the URI if it does not answer), marks RUNNING runs of the
same stage whose process is gone as KILLED, opens the run (named by the stage and matrix instance, tagged with the
pipeline-run id so the runs of one `dvc repro` can be found together) and yields a `StageRun`. On a clean exit it
writes the stage's provenance record, `reports/provenance/<stage>.json` (the run id, git commit, timestamps and
wall time live there and in MLflow, never in the stage's outputs), logs it as an artifact and marks the run
FINISHED; an exception marks it FAILED, Ctrl-C, SIGTERM, SIGHUP or SIGQUIT KILLED, and a run that did not finish
carries the one line the user read (tag `error`, shown as the run's description in `mlflow ui`).

Deferred mode, for a stage run on a node that cannot reach the store (`python -m agentrl sweep`): with
$AGENTRL_TRACKING_DEFER naming a directory, the run is recorded there instead (`Recorder`: the same calls, kept as
JSON and files), and `replay_run` later logs it into the project's store and writes its provenance record.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from agentrl.core import files
from agentrl.core.artifacts import StageError, temporary_name
from agentrl.core.boundary import Terminated, describe, mark_finished, signals_as_exceptions, signals_blocked
from agentrl.tracking.provenance import (
    build_provenance,
    flatten_params,
    git_info,
    loaded_unlisted,
    params_hash,
    project_root,
    work_root,
)
from agentrl.tracking.store import (
    DEFAULT_EXPERIMENT,
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VALUE,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VALUE,
    _chunks,
    _client,
    _ensure_experiment,
    _key,
    _metric_value,
    _retry,
    _value_text,
    artifact_location,
    configured_uri,
    log_artifact,
    probe,
    tracking_uri,
)

RECORD_DIR = Path("reports") / "provenance"
DEFER_ENV = "AGENTRL_TRACKING_DEFER"


def record_path(stage: str, root: Path | str | None = None) -> Path:
    """Where a stage's provenance record lives (relative to the working copy)."""
    return Path(root or work_root()) / RECORD_DIR / f"{stage}.json"


def _proc_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_tag(pid: int | None = None) -> str:
    """host:pid:start-time of a process: identifies it even after its pid is reused."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_proc_start(pid) or '?'}"


def process_alive(tag: str) -> bool | None:
    """Is the process a process_tag names still running? None when it ran on another host (cannot tell)."""
    try:
        host, pid, start = tag.rsplit(":", 2)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    return _proc_start(int(pid)) == start and start != "?"


def pipeline_run_id() -> str:
    """Identity of the pipeline invocation a stage runs under: $AGENTRL_PIPELINE_RUN, the DVC experiment's name, or
    the `dvc` process that launched the stage (host, pid, start time), found by walking up the process tree."""
    if os.environ.get("AGENTRL_PIPELINE_RUN"):
        return os.environ["AGENTRL_PIPELINE_RUN"]
    if os.environ.get("DVC_EXP_NAME"):
        return f"exp-{os.environ['DVC_EXP_NAME']}"
    pid = os.getppid()
    for _ in range(8):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if "dvc" in cmd.split(" ")[0].rsplit("/", 1)[-1] or "/dvc " in cmd or " dvc " in f" {cmd}":
            return "dvc-" + process_tag(pid).replace(":", "-")
        if ppid <= 1:
            break
        pid = ppid
    return "run-" + process_tag().replace(":", "-")


class StageRun:
    """Handle yielded by `stage_run`: the run id, the provenance content, and logging into the run."""

    def __init__(self, client, run_id: str, record: dict, artifact_uri: str | None = None, store_uri: str = ""):
        self._client = client
        self.run_id = run_id
        self._artifacts = (artifact_uri, store_uri)   # where log_artifact puts files (tracking.store.log_artifact)
        self.record = record
        self.fingerprint = record["fingerprint"]
        self.previous_seconds = 0.0   # a resumed stage adds the wall time of the runs it continues
        self.previous_runs: list[str] = []

    def log_metrics(self, metrics: Mapping, step: int | None = None) -> int:
        """Log one row of metrics (nested dicts flattened with dots) at `step`; returns how many were logged."""
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        rows = [Metric(_key(k), v, now, int(step or 0)) for k, raw in flatten_params(metrics).items()
                if (v := _metric_value(raw)) is not None]
        return self._log(rows)

    def log_history(self, rows: Iterable[Mapping], step_key: str = "step") -> int:
        """Log step rows (e.g. the training dashboard) in few transactions: `row[step_key]` is the step."""
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        metrics = []
        for index, row in enumerate(rows):
            step = row.get(step_key, index)
            step = int(step) if _metric_value(step) is not None else index
            for k, raw in flatten_params({k: v for k, v in row.items() if k != step_key}).items():
                if (v := _metric_value(raw)) is not None:
                    metrics.append(Metric(_key(k), v, now, step))
        return self._log(metrics)

    def _log(self, metrics: list) -> int:
        for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH):
            _retry(self._client.log_batch, self.run_id, metrics=chunk)
        return len(metrics)

    def set_tags(self, tags: Mapping) -> None:
        from mlflow.entities import RunTag
        items = [RunTag(_key(k), _value_text(v, MAX_TAG_VALUE)) for k, v in tags.items()]
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            _retry(self._client.log_batch, self.run_id, tags=chunk)

    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None:
        """A file or directory of the stage's outputs, browsable in the MLflow UI."""
        path = Path(path)
        if path.exists():
            log_artifact(self._client, self.run_id, *self._artifacts, path, artifact_path)


def _run_tags(record: dict, git: dict, work: Path, root: Path) -> dict:
    name = record["stage"]
    tags = {"stage": name.split("@", 1)[0], "stage.instance": name, "fingerprint": record["fingerprint"],
            "params_hash": params_hash(record["params"]), "code_hash": record["code_hash"],
            "code_files": " ".join(record["code_files"]), "git.commit": git["commit"],
            "git.dirty": str(git["dirty"]).lower(), "run.threads": str(record["threads"]),
            "pipeline_run": pipeline_run_id(), "process": process_tag()}
    tags.update({f"version.{k}": v for k, v in record["versions"].items()})
    tags.update({f"machine.{k}": v for k, v in (record.get("machine") or {}).items() if k != "env"})
    tags.update({f"machine.env.{k}": v for k, v in ((record.get("machine") or {}).get("env") or {}).items()})
    tags.update({f"input.{p}": h for p, h in record["inputs"].items()})
    if git["commit"] != "unknown":
        tags["mlflow.source.git.commit"] = git["commit"]
    for env, tag in (("DVC_EXP_NAME", "dvc.exp_name"), ("DVC_EXP_BASELINE_REV", "dvc.baseline_rev"),
                     ("AGENTRL_SWEEP", "sweep")):
        if os.environ.get(env):
            tags[tag] = os.environ[env]
    if work != root:
        tags["workdir"] = str(work)
    return {_key(k): _value_text(v, MAX_TAG_VALUE) for k, v in tags.items()}


def close_orphans(client, exp_id: str, stage: str) -> list[str]:
    """Mark every RUNNING run of the experiment whose process is gone (killed by SIGKILL, a crash such as SIGSEGV or
    SIGILL, a lost node), of any stage, as KILLED, so that no stage's run stays RUNNING until that same stage runs
    again. Returns the ids of those of `stage` (the runs this one takes over)."""
    runs = _retry(client.search_runs, [exp_id], filter_string="attributes.status = 'RUNNING'")
    mine = []
    for run in runs:
        if process_alive(run.data.tags.get("process", "")) is False:
            of = run.data.tags.get("stage.instance")
            _retry(client.set_tag, run.info.run_id, "killed_reason",
                   f"process gone (found by a later run of {stage})")
            _retry(client.set_terminated, run.info.run_id, "KILLED")
            if of == stage:
                mine.append(run.info.run_id)
    return mine


def _write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def write_index(directory: Path) -> None:
    """reports/provenance/README.md: one row per stage record (run id, params hash, commit, wall and CPU time), so
    the runs behind the report's numbers and the per-stage times of the last run are one click away."""
    rows = []
    for path in sorted(directory.glob("*.json")):
        try:
            r = json.loads(files.read_text(path, files.MAX_RECORD_BYTES, "a provenance record"))
        except (OSError, ValueError, files.InputFileError):
            continue
        rows.append(r)
    total = sum(r.get("this_run_seconds", 0.0) for r in rows)
    cpu = sum(r.get("this_run_cpu_seconds", 0.0) for r in rows)
    lines = ["# Provenance records", "",
             "One record per stage run, written by the stage when it finishes (`agentrl.tracking.run`): the MLflow "
             "run,",
             "the params hash, the code version, the wall time and the CPU time of all its threads. They are not stage",
             "outputs (outputs depend only on",
             "what made them), so a rerun rewrites these files and nothing else. `python -m agentrl audit` reads "
             "them.", "",
             "| stage | MLflow run | pipeline run | params hash | fingerprint | git commit | wall time (s) "
             "| CPU time (s) | started |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cpu_s = f"{r['this_run_cpu_seconds']:.1f}" if "this_run_cpu_seconds" in r else ""
        lines.append(f"| `{r['stage']}` | `{r['mlflow']['run_id']}` | `{r.get('pipeline_run', '')}` | "
                     f"`{r.get('params_hash', '')}` | `{r['fingerprint']}` | `{r.get('git_commit', '')[:12]}`"
                     f"{' (dirty)' if r.get('dirty') else ''} | {r.get('this_run_seconds', 0):.1f} | {cpu_s} | "
                     f"{r.get('started', '')} |")
    lines += ["", f"Sum of the stages' own wall times: {total:.0f} s, CPU times {cpu:.0f} s (interpreter start-up and "
              "DVC bookkeeping, about 2-5 s per stage, come on top)."]
    tmp = temporary_name(directory / "README.md")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, directory / "README.md")


@contextlib.contextmanager
def stage_run(stage: str, params: Mapping, inputs: Iterable[str | Path], threads: int | None,
              experiment: str = DEFAULT_EXPERIMENT, machine: Mapping | None = None, sources: Mapping | None = None):
    """Open exactly one MLflow run for a stage run and yield a `StageRun` (see the module doc). `machine` is the
    machine class the stage's numerics ran on (agentrl.core.numerics.machine_class; None without tensor work);
    `sources` where inputs came from (recorded in provenance, logged as params source.<input>.<field>)."""
    from mlflow.entities import Param
    work, root = work_root(), project_root()
    uri = tracking_uri(root)
    record = build_provenance(stage, params, inputs, threads, root=work, machine=machine,   # before any run exists
                              sources=sources)
    if os.environ.get(DEFER_ENV):
        client, exp_id, orphans = Recorder(os.environ[DEFER_ENV]), None, []
    else:
        probe(uri)
        client = _client(uri)
        exp_id = _ensure_experiment(client, uri, experiment, artifact_location(uri, root))
        orphans = close_orphans(client, exp_id, stage)
    git = git_info(work)
    run = _retry(client.create_run, exp_id, run_name=stage, tags=_run_tags(record, git, work, root))
    handle = StageRun(client, run.info.run_id, record, getattr(run.info, "artifact_uri", None), uri)
    handle.previous_runs = orphans
    started, cpu_started = time.time(), time.process_time()
    status, clean = "FAILED", False
    try:
        with signals_as_exceptions():   # SIGTERM closes the run KILLED, like Ctrl-C
            logged = {**record["params"], **({"run.threads": threads} if threads is not None else {}),
                      **flatten_params({"source": record.get("sources") or {}})}
            items = [Param(_key(k), _value_text(v, MAX_PARAM_VALUE)) for k, v in sorted(logged.items())]
            for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
                _retry(client.log_batch, handle.run_id, params=chunk)
            yield handle
            unlisted = loaded_unlisted(record["code_files"], work)
            if unlisted:
                raise StageError(f"{stage} loaded {unlisted[0]}, which is not among its code deps in dvc.yaml "
                                 f"({len(unlisted)} file(s)): name the registered entry in the stage's USES and run "
                                 "`python -m agentrl deps`")
            wall = time.time() - started
            out = {**record, "git_commit": git["commit"], "dirty": git["dirty"],
                   "params_hash": params_hash(record["params"]),
                   "mlflow": {"run_id": handle.run_id, "experiment": experiment, "tracking_uri": configured_uri(),
                              "continues": handle.previous_runs},
                   "pipeline_run": pipeline_run_id(),
                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                   "wall_seconds": round(handle.previous_seconds + wall, 3), "this_run_seconds": round(wall, 3),
                   "this_run_cpu_seconds": round(time.process_time() - cpu_started, 3)}
            _write_record(record_path(stage, work), out)
            write_index(record_path(stage, work).parent)
            handle.log_artifact(record_path(stage, work), "provenance")
            handle.log_metrics({"wall_seconds": out["wall_seconds"]})
            if handle.previous_runs:
                handle.set_tags({"continues": " ".join(handle.previous_runs)})
            status, clean = "FINISHED", True
    except (KeyboardInterrupt, Terminated, GeneratorExit) as exc:
        status = "KILLED"
        _explain(client, handle.run_id, exc, stage, "killed_reason")
        raise
    except SystemExit as exc:
        status = "FINISHED" if exc.code in (None, 0) else "FAILED"
        raise
    except BaseException as exc:
        _explain(client, handle.run_id, exc, stage, "error")
        raise
    finally:
        try:
            with signals_blocked():   # the status is written whole; a signal meanwhile is delivered after it
                _retry(client.set_terminated, handle.run_id, status)
                if clean:
                    mark_finished()
        except Exception:
            if clean:
                raise
            print(f"warning: could not mark MLflow run {handle.run_id} as {status}", file=sys.stderr)


def _explain(client, run_id: str, exc: BaseException, stage: str, tag: str) -> None:
    """Tag a run that did not finish with the line its process printed (best effort: the store may be the
    problem)."""
    with signals_blocked():   # a second Ctrl-C or SIGTERM (DVC and the terminal both send one) waits for the tag
        line = describe(exc, stage)[1]
        try:
            _retry(client.log_batch, run_id, tags=[_tag(tag, line), _tag("mlflow.note.content", line)], tries=3)
        except Exception:
            pass


def _tag(key: str, value: str):
    from mlflow.entities import RunTag
    return RunTag(key, _value_text(value, MAX_TAG_VALUE))


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
        _write_record(self.dir / "run.json", self.run)


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
    git = git_info(root)
    run_tags = {**kept["tags"], **(tags or {}), "git.commit": git["commit"], "git.dirty": str(git["dirty"]).lower(),
                "process": process_tag()}
    run_tags.pop("workdir", None)
    if git["commit"] != "unknown":
        run_tags["mlflow.source.git.commit"] = git["commit"]
    run = _retry(client.create_run, exp_id, start_time=kept["start_time"], run_name=kept["name"],
                 tags={_key(k): _value_text(v, MAX_TAG_VALUE) for k, v in run_tags.items()})
    run_id = run.info.run_id
    from mlflow.entities import Metric, Param
    for chunk in _chunks([Param(k, v) for k, v in sorted(kept["params"].items())], MAX_PARAMS_TAGS_PER_BATCH):
        _retry(client.log_batch, run_id, params=chunk)
    for chunk in _chunks([Metric(*m) for m in kept["metrics"]], MAX_METRICS_PER_BATCH):
        _retry(client.log_batch, run_id, metrics=chunk)
    for rel, artifact_path in kept["artifacts"]:
        if artifact_path == "provenance":
            record = json.loads(files.read_text(directory / "artifacts" / rel, files.MAX_RECORD_BYTES,
                                                "a kept provenance record"))
            record.update(git_commit=git["commit"], dirty=git["dirty"], pipeline_run=run_tags.get("pipeline_run", ""))
            record["mlflow"].update(run_id=run_id, experiment=experiment, tracking_uri=configured_uri())
            path = record_path(record["stage"], root)
            _write_record(path, record)
            write_index(path.parent)
            log_artifact(client, run_id, run.info.artifact_uri, uri, path, "provenance")
        else:
            log_artifact(client, run_id, run.info.artifact_uri, uri, directory / "artifacts" / rel, artifact_path)
    _retry(client.set_terminated, run_id, kept["status"], end_time=kept.get("end_time"))
    return run_id
