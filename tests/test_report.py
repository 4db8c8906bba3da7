"""The capstone report, built from the real stage outputs in reports/: every number can be traced with
`python -m agentrl audit`, every image link is relative and resolves, every required section is there, no raw HTML.

The report logic runs into a scratch project root that mirrors the repository (symlinks to agentrl/, stages/,
data/, params.yaml and each stage output in reports/), so the workspace's own reports/capstone.* are never touched;
`python -m agentrl audit` runs with that root as its working directory and finds the stage outputs (and, through
the tracking URI each provenance block records, their MLflow runs) exactly as it would in the repository."""
from __future__ import annotations

import ast
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OUTPUTS = {"capstone.md", "capstone.json", "capstone_sources.json"}
REQUIRED_SECTIONS = ("Pinned configuration", "Preflight", "Starting policy", "Training dashboard", "Checkpoints",
                     "Test", "Ablation", "What the agent learned", "Power", "Stopping signals",
                     "Thread-count experiment", "Fault catalogue", "Provenance")
N_AUDITED = 10

pytestmark = pytest.mark.skipif(not (REPO / "reports" / "test.json").exists(),
                                reason="reports/test.json absent: run `dvc repro` first")


def _mirror(root: Path) -> None:
    """A scratch project root: the repository's code, params and data by symlink; reports/ and reports/figures/ as
    real directories whose entries link to the repository's, minus the report's own outputs."""
    for name in ("agentrl", "stages", "data", "params.yaml", "dvc.yaml", "pyproject.toml"):
        if (REPO / name).exists():
            (root / name).symlink_to(REPO / name)
    reports = root / "reports"
    (reports / "figures").mkdir(parents=True)
    for item in (REPO / "reports").iterdir():
        if item.name not in OUTPUTS and item.name != "figures":
            (reports / item.name).symlink_to(item)
    for item in (REPO / "reports" / "figures").iterdir():
        if item.name != "capstone":
            (reports / "figures" / item.name).symlink_to(item)


REPORT_DATA = ("data/tasks/tokenizer.json", "data/tasks/split.json", "data/models/base.pt", "data/train/checkpoints")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The report rebuilt from the workspace's stage outputs; in a checkout without the pipeline's data/ (a fresh
    clone), the committed report itself, checked against the committed stage outputs."""
    if not all((REPO / p).exists() for p in REPORT_DATA):
        reports = REPO / "reports"
        return {"root": REPO, "markdown": (reports / "capstone.md").read_text(),
                "sources": json.loads((reports / "capstone_sources.json").read_text())}
    from agentrl.params import load_params
    from agentrl.pipeline import section_values
    from agentrl.report import SECTIONS, build, input_paths
    from agentrl.tracking import PROVENANCE_KEYS, build_provenance

    root = tmp_path_factory.mktemp("capstone_root")
    _mirror(root)
    require_faults = (REPO / "reports" / "faults.json").exists()
    params = load_params(["run"] + SECTIONS, REPO / "params.yaml")
    logged = {s: section_values(s, p) for s, p in params.items()}
    prov = build_provenance("report", logged, input_paths(root, require_faults), params["run"].threads, root=REPO)
    prov = {**prov, "mlflow_run_id": None, "experiment": None, "tracking_uri": None}  # no MLflow run for a test build
    build(params, {k: prov[k] for k in PROVENANCE_KEYS}, root, require_faults=require_faults)
    reports = root / "reports"
    return {"root": root, "markdown": (reports / "capstone.md").read_text(),
            "sources": json.loads((reports / "capstone_sources.json").read_text())}


def _audited_value(line: str, source: str):
    """The value on the first line of `python -m agentrl audit` output: `<source> = <repr or JSON>`."""
    prefix = f"{source} = "
    assert line.startswith(prefix), f"unexpected audit output: {line!r}"
    text = line[len(prefix):]
    assert not text.endswith("..."), f"audit truncated the value of {source}: {text!r}"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return json.loads(text)


def test_every_recorded_number_is_in_the_markdown_and_matches_its_source(built):
    from agentrl.report import fmt_value
    from agentrl.tracking import extract
    entries = built["sources"]["entries"]
    assert entries and built["sources"]["count"] == len(entries)
    for e in entries:
        assert e["text"] in built["markdown"], e
        file, path = e["source"].rsplit(":", 1)
        data = json.loads((built["root"] / file).read_text())
        assert fmt_value(extract(data, path, file), e["format"]) == e["text"], e


def test_ten_random_numbers_trace_with_audit(built):
    from agentrl.report import fmt_value
    entries = built["sources"]["entries"]
    picked = random.Random(0).sample(entries, min(N_AUDITED, len(entries)))
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "MLFLOW_TRACKING_URI")}
    for e in picked:
        out = subprocess.run([sys.executable, "-m", "agentrl", "audit", e["source"]], cwd=built["root"], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode in (0, 1), f"audit {e['source']} failed: {out.stderr}"  # 1 = stale workspace: fine
        value = _audited_value(out.stdout.splitlines()[0], e["source"])
        assert fmt_value(value, e["format"]) == e["text"], (e, value)
        assert e["text"] in built["markdown"]


def test_image_links_are_relative_and_exist(built):
    reports = built["root"] / "reports"
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", built["markdown"])
    assert any(link.startswith("figures/capstone/") for link in images)
    for link in images:
        assert "://" not in link and not link.startswith("/"), link
        assert (reports / link).is_file(), link
    for link in re.findall(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)", built["markdown"]):  # plain links to local files
        if "://" not in link and not link.startswith("#"):
            assert not link.startswith("/") and (reports / link).exists(), link


def test_required_sections(built):
    headings = {line[3:].strip() for line in built["markdown"].splitlines() if line.startswith("## ")}
    missing = [s for s in REQUIRED_SECTIONS if s not in headings]
    assert not missing, missing


def test_no_raw_html(built):
    in_fence = False
    for n, line in enumerate(built["markdown"].splitlines(), 1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        prose = re.sub(r"`[^`]*`", "", line)  # inline code may show tokens like <call>
        assert not re.search(r"<\s*/?\s*[A-Za-z!][^>]*>", prose), f"raw HTML on line {n}: {line}"
        assert not re.search(r"&[a-z]+;", prose), f"HTML entity on line {n}: {line}"
    assert not in_fence, "unclosed code fence"
