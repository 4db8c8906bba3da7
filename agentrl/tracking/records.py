"""Provenance records on disk: `reports/provenance/<stage>.json`, written by a stage run when it finishes
(agentrl.tracking.run) or by the replay of a deferred one (agentrl.tracking.deferred), and their index README.md."""
from __future__ import annotations

import json
from pathlib import Path

from agentrl.core import files
from agentrl.core.artifacts import replacing
from agentrl.tracking.provenance import work_root

RECORD_DIR = Path("reports") / "provenance"


def record_path(stage: str, root: Path | str | None = None) -> Path:
    """Where a stage's provenance record lives (relative to the working copy)."""
    return Path(root or work_root()) / RECORD_DIR / f"{stage}.json"


def write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


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
    with replacing(directory / "README.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
