"""`audit` of a number no dvc.lock entry covers: an output of a stage run outside `dvc repro` (a lab, `python -m
stages.lab --lab smollm2 --seed 3`; an explored recipe's lab; any matrix instance run by hand), traced through the
provenance record that stage run wrote (reports/provenance/<stage>@<instance>.json): its params (a lab's resolved
config and seed) and their hash, its code closure and code hash, the model directory it loaded with that directory's
source hashes, the commit, machine, dtype and MLflow run; and whether the record's inputs still match this tree: the
params in params.yaml (a lab's config resolved through its base, or read from its config file), the bytes of every
code file (the ones changed since the record's commit named), the inputs it hashed, the model directory. A record
whose report moved (a recipe's seed renamed from its own config, an explored recipe moved to
reports/labs/explored/) says so under `moved`, and is compared under the name it has now.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from agentrl.core import files
from agentrl.core.artifacts import shape_problem
from agentrl.core.knobs import UserError
from agentrl.tracking.provenance import _git, changed_inputs, code_hash, flatten_params, params_hash
from agentrl.tracking.records import record_path

RECORD_SHAPE = {"stage": str, "params": dict, "code_files": [str], "code_hash": str, "mlflow": {"run_id": str}}
EXPLORED_REPORT = re.compile(r"reports/labs/explored/([A-Za-z0-9_]+)/seed([0-9]+)\.json")
SOURCE_FILE = "agentrl_source.json"   # agentrl.backends.pretrained: where a converted model came from


def _read_json(path: Path):
    try:
        return json.loads(files.read_text(path, files.MAX_RECORD_BYTES, "a record"))
    except (OSError, ValueError, RecursionError):   # InputFileError is a ValueError
        return None


def outside_stage(file: str, root: Path) -> tuple[str, str, dict] | None:
    """(stage instance, cmd, provenance record) of the dvc.yaml stage whose outputs name `file`, when its record
    exists: a matrix output such as reports/labs/${item.lab}.json gives the instance lab@<lab>."""
    import yaml
    explored = EXPLORED_REPORT.fullmatch(file)   # an explored recipe's lab (agentrl.labs.instance), run by hand
    if explored:
        instance = f"lab@explored.{explored.group(1)}-{explored.group(2)}"
        record = _read_json(record_path(instance, root))
        if record is not None and shape_problem(record, RECORD_SHAPE) is None:
            return instance, f"python -m stages.lab --config reports/labs/explored/{explored.group(1)}/config.yaml " \
                             f"--seed {explored.group(2)}", record
    try:
        graph = yaml.safe_load(files.read_text(root / "dvc.yaml", files.MAX_TEXT_BYTES, "dvc.yaml")) or {}
    except (OSError, ValueError, yaml.YAMLError):
        return None
    for name, stage in (graph.get("stages") or {}).items():
        if not isinstance(stage, dict):
            continue
        keys = list(stage.get("matrix") or {})
        for out in stage.get("outs") or []:
            template = next(iter(out)) if isinstance(out, dict) else str(out)
            pattern = re.escape(template)
            for key in keys:
                pattern = pattern.replace(re.escape(f"${{item.{key}}}"), f"(?P<{key}>[^/]+)")
            match = re.fullmatch(pattern, file)
            if match is None:
                continue
            instance = f"{name}@{'-'.join(match.group(k) for k in keys)}" if keys else name
            record = _read_json(record_path(instance, root))
            if record is not None and shape_problem(record, RECORD_SHAPE) is None:
                return instance, str(stage.get("cmd", "")), record
    return None


def recorded_params(record: dict) -> dict:
    """The record's params under the names they have now: a moved lab record's `lab.configs.<old>.` keys become
    its recipe's, and its config's `seed` becomes `lab.seed`."""
    moved = record.get("moved")
    params = dict(record["params"])
    if not isinstance(moved, dict) or not isinstance(moved.get("config"), str):
        return params
    old, new = f"lab.configs.{moved['config']}.", f"lab.configs.{moved['recipe']}."
    out = {(new + k[len(old):] if k.startswith(old) else k): v for k, v in params.items()}
    out.pop(f"{new}seed", None)
    out["lab.seed"] = moved["seed"]
    if moved.get("config_file"):
        out["lab.config_file"] = moved["config_file"]
    return out


def _lab_now(recorded: dict, raw: dict, root: Path) -> tuple[dict, str | None]:
    """A lab record's lab keys as this tree has them: the shared settings, the seed (the instance's own), and the
    config resolved through its base in params.yaml, or read from the config file the record names."""
    from agentrl.core.knobs import ConfigError
    from agentrl.core.lab_config import LAB_CONFIGS, read_config_file, resolve, resolve_spec
    lab = raw.get("lab") if isinstance(raw.get("lab"), dict) else {}
    configs = lab.get("configs", LAB_CONFIGS)
    names = {k.split(".")[2] for k in recorded if k.startswith("lab.configs.") and k.count(".") >= 3}
    now = {"lab.device": lab.get("device", "cpu"), "lab.eval_batch": lab.get("eval_batch", 40)}
    for key in ("lab.seed", "lab.config_file"):
        if key in recorded:
            now[key] = recorded[key]
    for name in names:
        try:
            if "lab.config_file" in recorded:
                spec = resolve_spec(read_config_file(root / recorded["lab.config_file"]), configs,
                                    recorded["lab.config_file"], strict=False)
            else:
                spec = resolve(configs, name, "lab.configs", strict=False) if name in configs else None
        except ConfigError as exc:
            return now, str(exc)[:200]
        if spec is not None:
            now.update(flatten_params({"lab": {"configs": {name: spec}}}))
    return now, None


def _current_params(recorded: dict, root: Path) -> tuple[dict, str | None]:
    """params.yaml's values (each section's defaults under what the file sets) for the keys the record holds and
    any new key beside them, or why the file cannot be read. Values are compared, not validated: a refused value
    is the stage's to name."""
    import dataclasses

    from agentrl.core.config import SECTIONS, read_params_file
    try:
        raw = read_params_file(root / "params.yaml")
    except (UserError, OSError) as exc:
        return {}, str(exc).splitlines()[0][:200]
    values = {}
    lab_record = any(k.startswith("lab.configs.") for k in recorded)
    for section in sorted({k.split(".", 1)[0] for k in recorded} & set(SECTIONS) - ({"lab"} if lab_record else set())):
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(SECTIONS[section])
                    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
        given = raw.get(section) if isinstance(raw.get(section), dict) else {}
        values[section] = {**defaults, **given}
        if section == "rl":
            values[section].pop("seed", None)   # run.seed is the stage's seed
    now = flatten_params(values)
    if lab_record:
        lab_now, problem = _lab_now(recorded, raw, root)
        if problem:
            return {}, problem
        now.update(lab_now)
    parents = {k.rsplit(".", 1)[0] + "." for k in recorded if k.count(".") >= 3}   # an entry: lab.configs.<lab>.
    return {k: v for k, v in now.items() if k in recorded or k.rsplit(".", 1)[0] + "." in parents
            or k.startswith("lab.configs.")}, None


def _model_dir(params: dict, root: Path) -> dict | None:
    """The model directory a record's params name (a key ending in `.model`), with where it came from."""
    key = next((k for k, v in sorted(params.items()) if k.endswith(".model") and isinstance(v, str) and v), None)
    if key is None:
        return None
    path = root / params[key]
    source = _read_json(path / SOURCE_FILE) if path.is_dir() else None
    out = {"param": key, "path": params[key], "exists": path.is_dir(), "source": source}
    if isinstance(source, dict) and source.get("name"):
        converted = _read_json(record_path(f"pretrained@{source['name']}", root))
        if isinstance(converted, dict):
            out["converted_by"] = {"record": record_path(f"pretrained@{source['name']}", Path(".")).as_posix(),
                                   "inputs": converted.get("inputs") or {}, "git_commit": converted.get("git_commit"),
                                   "fingerprint": converted.get("fingerprint")}
    return out


def _mismatches(record: dict, root: Path, model: dict | None) -> list[str]:
    """What in this tree differs from what the record says produced the number."""
    out = []
    recorded = recorded_params(record)
    now, problem = _current_params(recorded, root)
    if problem:
        out.append(f"params.yaml: {problem}")
    else:
        for key in sorted(set(recorded) | set(now)):
            if key not in now:
                out.append(f"param {key}: {json.dumps(recorded[key])} in the record, not in params.yaml")
            elif key not in recorded:
                out.append(f"param {key}: {json.dumps(now[key])} in params.yaml, not in the record")
            elif json.dumps(now[key], sort_keys=True) != json.dumps(recorded[key], sort_keys=True):
                out.append(f"param {key}: {json.dumps(recorded[key])} in the record, {json.dumps(now[key])} now")
    missing = [f for f in record["code_files"] if not (root / f).is_file()]
    if missing:
        out.append(f"code: {missing[0]} is gone ({len(missing)} file(s))")
    elif code_hash(record["code_files"], root) != record["code_hash"]:
        commit = record.get("git_commit") or ""
        changed = (_git(["diff", "--name-only", commit, "--", *record["code_files"]], root) or "").split() \
            if re.fullmatch(r"[0-9a-f]{40}", commit) else []
        out.append("code: the closure's bytes differ from the record's" +
                   (f" (changed since {commit[:12]}: {', '.join(changed[:6])}{', ...' if len(changed) > 6 else ''})"
                    if changed else ""))
    for rel, gone in changed_inputs(record.get("inputs") or {}, root):
        out.append(f"input {rel}: {'missing' if gone else 'its bytes differ from the record'}")
    if model is not None:
        if not model["exists"]:
            out.append(f"model directory {model['path']}: missing")
        elif model.get("converted_by") and isinstance(model["source"], dict) and \
                model["source"].get("sha256") not in model["converted_by"]["inputs"].values():
            out.append(f"model directory {model['path']}: converted from another file than its pretrained record says")
    return out


def audit_outside(spec: str, file: str, dotted: str, value, instance: str, cmd: str, record: dict, root: Path,
                  fetch_run) -> dict:
    """The audit of `value` (see the module doc); `fetch_run(run_id)` looks the MLflow run up."""
    model = _model_dir(recorded_params(record), root)
    reasons = _mismatches(record, root, model)
    dtype = next((v for k, v in sorted(record["params"].items()) if k.endswith(".dtype")), None) or \
        ((model or {}).get("source") or {}).get("dtype")
    return {"spec": spec, "file": file, "path": dotted, "value": value, "stage": instance, "cmd": cmd,
            "outside": True, "record_file": record_path(instance, Path(".")).as_posix(), "record": record,
            "params_hash": record.get("params_hash") or params_hash(record["params"]), "model": model,
            "dtype": dtype, "run": fetch_run(record["mlflow"]["run_id"]),
            "status": "current" if not reasons else "stale", "reasons": reasons}


def format_outside(result: dict, short) -> str:
    from agentrl.tracking.lineage import format_machine, format_run
    rec, run, model = result["record"], result["run"], result["model"]
    lines = [f"{result['file']}:{result['path']} = {short(result['value'])}",
             f"  stage        : {result['stage']}   ({result['cmd']}), run outside `dvc repro`: dvc.lock holds no "
             f"entry for it, so this is traced through its provenance record {result['record_file']}"]
    moved = rec.get("moved")
    if isinstance(moved, dict):
        lines.append(f"  moved        : ran as {moved.get('stage')} (report {moved.get('report')}), moved since: "
                     f"{moved.get('why', '')}")
    lines.append(format_run(run, rec["mlflow"]["run_id"]))
    lines.append(f"  started      : {rec.get('started', '-')}, {rec.get('wall_seconds', '-')} s wall")
    lines.append(f"  machine      : {format_machine(rec.get('machine'))}")
    lines.append(f"  dtype        : {result['dtype'] or 'not recorded'}")
    lines.append("  versions     : " + ", ".join(f"{k} {v}" for k, v in (rec.get("versions") or {}).items()))
    lines.append(f"  code version : commit {rec.get('git_commit', '-')}{' (dirty)' if rec.get('dirty') else ''}, "
                 f"code hash {rec['code_hash']} over {len(rec['code_files'])} files")
    lines.append(f"  params       : {len(rec['params'])}, hash {result['params_hash']}")
    lines += [f"      {k} = {short(v, 120)}" for k, v in sorted(rec["params"].items())]
    if model is not None:
        where = "present" if model["exists"] else "MISSING"
        lines.append(f"  model        : {model['path']} ({model['param']}; {where})")
        source = model["source"] if isinstance(model["source"], dict) else {}
        if source:
            lines.append(f"      source: {source.get('honest_name') or source.get('model')}, {source.get('package')} "
                         f"{source.get('version')} (wheel sha256 {source.get('wheel_sha256')}), {source.get('member')} "
                         f"sha256 {source.get('sha256')}")
        if model.get("converted_by"):
            conv = model["converted_by"]
            lines.append(f"      converted by {conv['record']} (commit {str(conv['git_commit'])[:12]}, fingerprint "
                         f"{conv['fingerprint']})")
    lines += [f"  input        : {k}  sha256 {v}" for k, v in sorted((rec.get("inputs") or {}).items())]
    if result["status"] == "current":
        lines.append("  status       : current (this tree's params, code, inputs and model directory match the record)")
    else:
        lines.append(f"  status       : STALE ({len(result['reasons'])} difference(s) from the record in this tree)")
        lines += [f"      - {r}" for r in result["reasons"]]
    return "\n".join(lines)
