"""One MLflow run per stage run, from start to a status that is never left RUNNING by a process that is gone.

`stage_run(stage, params, inputs, threads)` hashes the stage's provenance (fails before anything exists if an
input is missing), probes the store (one line naming the URI if it does not answer), marks RUNNING runs whose
process is gone as KILLED (agentrl.tracking.orphans), opens the run (named by the stage and matrix instance, tagged
with the pipeline-run id so the runs of one `dvc repro` can be found together) and yields a `StageRun`. On a clean
exit it writes the stage's provenance record, `reports/provenance/<stage>.json` (the run id, git commit, timestamps
and wall time live there and in MLflow, never in the stage's outputs), logs it as an artifact and marks the run
FINISHED; an exception marks it FAILED, Ctrl-C, SIGTERM, SIGHUP or SIGQUIT KILLED, and a run that did not finish
carries the one line the user read (tag `error`, shown as the run's description in `mlflow ui`).

No signal finds a run that nothing will close: the ending signals are held back from the moment the run is created
until the code that closes it is in charge (a signal meanwhile is acted on right after, the run closed KILLED), and a
watcher process (agentrl.tracking.watch) closes the run if the stage's process ends without closing it (SIGKILL, a
crash). $AGENTRL_RUN_DELAY=<phase>:<seconds> holds run creation at one of `PHASES` (for tests that send a signal
there).

With $AGENTRL_TRACKING_DEFER naming a directory, the run is recorded there instead, for a later replay into the
store (agentrl.tracking.deferred).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from agentrl.core.artifacts import StageError
from agentrl.core.boundary import Terminated, describe, mark_finished, signals_as_exceptions, signals_blocked
from agentrl.tracking import watch
from agentrl.tracking.deferred import DEFER_ENV, Recorder, unblocked
from agentrl.tracking.orphans import close_orphans, process_tag
from agentrl.tracking.provenance import (
    build_provenance,
    flatten_params,
    git_info,
    loaded_unlisted,
    params_hash,
    project_root,
    work_root,
)
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
    vanished,
)
from agentrl.tracking.values import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VALUE,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VALUE,
    _chunks,
    _key,
    _metric_value,
    _value_text,
)

DELAY_ENV = "AGENTRL_RUN_DELAY"
PHASES = ("provenance", "probe", "store", "orphans", "create", "created", "params")   # run creation, in order


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


def _hold(phase: str) -> None:
    """The test hook: wait at `phase` of run creation when $AGENTRL_RUN_DELAY names it (said in a warning line)."""
    name, _, seconds = os.environ.get(DELAY_ENV, "").partition(":")
    if name == phase:
        print(f"warning: {DELAY_ENV}: run creation held {seconds} s at {phase}", file=sys.stderr, flush=True)
        time.sleep(float(seconds or 0))


@contextlib.contextmanager
def stage_run(stage: str, params: Mapping, inputs: Iterable[str | Path], threads: int | None,
              experiment: str = DEFAULT_EXPERIMENT, machine: Mapping | None = None, sources: Mapping | None = None):
    """Open exactly one MLflow run for a stage run and yield a `StageRun` (see the module doc). `machine` is the
    machine class the stage's numerics ran on (agentrl.core.numerics.machine_class; None without tensor work);
    `sources` where inputs came from (recorded in provenance, logged as params source.<input>.<field>)."""
    from mlflow.entities import Param
    work, root = work_root(), project_root()
    uri = tracking_uri(root)
    _hold("provenance")
    record = build_provenance(stage, params, inputs, threads, root=work, machine=machine,   # before any run exists
                              sources=sources)
    deferred = bool(os.environ.get(DEFER_ENV))
    if deferred:
        client, exp_id, orphans = Recorder(os.environ[DEFER_ENV]), None, []
    else:
        _hold("probe")
        probe(uri)
        _hold("store")
        client = _client(uri)
        exp_id = _ensure_experiment(client, uri, experiment, artifact_location(uri, root))
        _hold("orphans")
        orphans = close_orphans(client, [exp_id], f"a later run of {stage}", stage)
    git = git_info(work)
    tags = _run_tags(record, git, work, root)
    handle, watcher, started, cpu_started = None, None, time.time(), time.process_time()
    status, clean = "FAILED", False
    try:
        with signals_as_exceptions():   # SIGTERM closes the run KILLED, like Ctrl-C
            with signals_blocked():   # from the run's creation until this block owns it, a signal waits
                _hold("create")
                run = _retry(client.create_run, exp_id, run_name=stage, tags=tags, wait=unblocked)
                handle = StageRun(client, run.info.run_id, record, getattr(run.info, "artifact_uri", None), uri)
                handle.previous_runs = orphans
                _hold("created")
            watcher = None if deferred else watch.start(handle.run_id, uri)
            _hold("params")
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
            write_record(record_path(stage, work), out)
            write_index(record_path(stage, work).parent)
            handle.log_artifact(record_path(stage, work), "provenance")
            handle.log_metrics({"wall_seconds": out["wall_seconds"]})
            if handle.previous_runs:
                handle.set_tags({"continues": " ".join(handle.previous_runs)})
            status, clean = "FINISHED", True
    except (KeyboardInterrupt, Terminated, GeneratorExit) as exc:
        status = "KILLED"
        if handle is not None:
            _explain(client, handle.run_id, exc, stage, "killed_reason")
        raise
    except SystemExit as exc:
        status = "FINISHED" if exc.code in (None, 0) else "FAILED"
        raise
    except BaseException as exc:
        if handle is not None:
            _explain(client, handle.run_id, exc, stage, "error")
        raise
    finally:
        if handle is not None:
            _close(client, handle.run_id, status, clean, watcher)


def _close(client, run_id: str, status: str, clean: bool, watcher) -> None:
    """The run's final status, written whole (a signal meanwhile is delivered after it); then its watcher stands
    down. A store that refuses leaves the run to the watcher, said in one warning line."""
    try:
        with signals_blocked():
            _retry(client.set_terminated, run_id, status)
            if clean:
                mark_finished()
    except Exception:
        if clean:
            raise
        if not vanished():   # a lost store was said in the stage's one line; its runs went with it
            print(f"warning: could not mark MLflow run {run_id} as {status}", file=sys.stderr)
        return
    if watcher is not None:
        watcher.closed()


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
