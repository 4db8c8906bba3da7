"""The whole chain that produced a number: each upstream stage (from dvc.lock: the stage that wrote each input),
the params it read, its threads, numerics and machine class, and what differs from the committed baseline.

A test number is produced by the test stage *and* by the train stage that made the checkpoint it tests (and the
base, and the tasks): after `dvc exp run -S rl.kl_coef=0.05`, `rl.kl_coef` is a param of the train stage, not of
the test stage, so an audit that stops at the producing stage never shows it. The baseline is the dvc.lock of the
commit checked out (HEAD), so an experiment's changes are marked against what the repository committed.
"""
from __future__ import annotations

import json
from pathlib import Path

from agentrl.core import files
from agentrl.tracking.closure import is_code
from agentrl.tracking.provenance import _git


def lock_stages(text: str | None) -> dict:
    import yaml
    if not text:
        return {}
    try:
        stages = (yaml.safe_load(text) or {}).get("stages", {}) or {}
    except (yaml.YAMLError, AttributeError):
        return {}
    return {k: v for k, v in stages.items() if isinstance(v, dict)} if isinstance(stages, dict) else {}


def flat_params(entry: dict) -> dict:
    """A lock entry's params as {"rl.lr": value} (params.yaml keys unprefixed, other files as 'file:key')."""
    from agentrl.tracking.provenance import flatten_params
    out, params = {}, entry.get("params") or {}
    for pfile, values in (params.items() if isinstance(params, dict) else ()):
        flat = flatten_params(values if isinstance(values, dict) else {})
        out.update(flat if pfile == "params.yaml" else {f"{pfile}:{k}": v for k, v in flat.items()})
    return out


def _writer(path: str, stages: dict) -> str | None:
    """The stage whose outs hold `path` (the out itself or a directory above it)."""
    for name, entry in stages.items():
        for out in entry.get("outs") or []:
            o = str(out.get("path", "")) if isinstance(out, dict) else ""
            if path == o or path.startswith(o.rstrip("/") + "/"):
                return name
    return None


def upstream(stage: str, stages: dict) -> list[str]:
    """Every stage that wrote an input of `stage`, transitively, nearest first (breadth first, each once)."""
    order, queue, seen = [], [stage], {stage}
    while queue:
        current = queue.pop(0)
        for dep in stages.get(current, {}).get("deps") or []:
            path = str(dep.get("path", "")) if isinstance(dep, dict) else ""
            if is_code(path):
                continue
            writer = _writer(path, stages)
            if writer and writer not in seen:
                seen.add(writer)
                order.append(writer)
                queue.append(writer)
    return order


def _record(stage: str, root: Path) -> dict:
    from agentrl.tracking.records import record_path
    path = record_path(stage, root)
    try:
        record = json.loads(files.read_text(path, files.MAX_RECORD_BYTES, "a provenance record"))
    except (OSError, ValueError, files.InputFileError):
        return {}
    return record if isinstance(record, dict) else {}   # a damaged record says nothing, it does not crash audit


def lineage(stage: str, root: Path) -> dict:
    """{"stages": [{stage, params, changed, threads, machine, verdict, why}], "baseline": what it compares to}.
    `changed` maps a param whose value differs from the committed dvc.lock to that committed value; a stage the
    commit has no lock entry for is marked new."""
    lock = root / "dvc.lock"
    stages = lock_stages(files.read_text(lock, files.MAX_TEXT_BYTES, "dvc.lock") if lock.exists() else None)
    committed = lock_stages(_git(["show", "HEAD:dvc.lock"], root))
    out = []
    for name in [stage] + upstream(stage, stages):
        params = flat_params(stages.get(name, {}))
        base = flat_params(committed[name]) if name in committed else None
        changed = {} if base is None else {k: base.get(k, "(absent)") for k, v in params.items() if base.get(k) != v}
        rec = _record(name, root)
        machine = rec.get("machine")
        out.append({"stage": name, "params": params, "changed": changed, "new": base is None and bool(committed),
                    "threads": rec.get("threads"), "machine": machine if isinstance(machine, dict) else None})
    return {"stages": out, "baseline": "HEAD:dvc.lock" if committed else None}


def attach_verdicts(chain: dict) -> tuple[str, str]:
    """Give each stage of the chain its reproduction verdict on this machine; return the chain's (the weakest):
    bit-for-bit only when every stage with tensor work can be rebuilt bit for bit here."""
    from agentrl.core.numerics import here_for, reproduction_verdict
    worst, why = "bit-for-bit", "every stage of the lineage ran with numerics this machine reproduces"
    rank = {"bit-for-bit": 0, "unknown": 1, "statistical": 2}
    for item in chain["stages"]:
        if item["machine"] is None and "run.threads" not in item["params"]:
            item["verdict"], item["why"] = "bit-for-bit", "no tensor work (a pure function of its inputs)"
        elif item["machine"] is None:
            item["verdict"], item["why"] = reproduction_verdict(None, {})
        else:
            here = here_for(item["machine"].get("mode"), item["machine"].get("threads"))
            item["verdict"], item["why"] = reproduction_verdict(item["machine"], here)
        if rank[item["verdict"]] > rank[worst]:
            worst, why = item["verdict"], f"{item['stage']}: {item['why']}"
    return worst, why


def format_machine(machine: dict | None) -> str:
    if not isinstance(machine, dict) or not machine:
        return "-"
    return (f"{machine.get('mode')} numerics, {machine.get('isa')} kernels, {machine.get('cpu_vendor')} "
            f"{machine.get('cpu_model')}, MKL {machine.get('mkl')}, oneDNN {machine.get('onednn')}, "
            f"{machine.get('threads')} threads")


def format_run(run: dict, run_id: str | None) -> str:
    """The audit's line of a stage run's MLflow run (agentrl.tracking.audit.fetch_run's answer)."""
    if not run["found"]:
        return f"  mlflow run   : {run_id or '-'} (not found: {run['error']})"
    return (f"  mlflow run   : {run['run_id']} ({run['status']}, run name {run['name']!r}, pipeline run "
            f"{run['pipeline_run']})   store: {run['tracking_uri']}")


def format_lineage(chain: dict, short) -> list[str]:
    lines = [f"  lineage      : {len(chain['stages'])} stage(s), this one and every stage upstream of it (dvc.lock)"
             + ("; * = differs from the committed " + chain["baseline"] if chain["baseline"] else "")]
    for item in chain["stages"]:
        lines.append(f"    {item['stage']}{'  (new: not in the committed dvc.lock)' if item['new'] else ''}")
        lines.append(f"      numerics : {format_machine(item['machine'])}   -> {item.get('verdict', '?')}")
        parts = []
        for key, value in sorted(item["params"].items()):
            mark = f" * (committed {short(item['changed'][key], 40)})" if key in item["changed"] else ""
            parts.append(f"{key}={short(value, 60)}{mark}")
        line = "      params   :"
        for part in parts or ["(none)"]:
            if len(line) + len(part) > 116 and not line.endswith(":"):
                lines.append(line.rstrip(","))
                line = "                "
            line += f" {part},"
        lines.append(line.rstrip(","))
    return lines
