"""The capstone report, rebuilt from the committed stage outputs in reports/: every number can be traced with
`python -m agentrl audit`, every image link is relative and resolves, every required section is there, no raw HTML,
and the rebuild is byte-identical to the committed report (it renders stage outputs only: no model, no data/).

The report logic runs into a scratch root that mirrors reports/ (minus the report's own outputs), so the
workspace's reports/capstone.* are never touched."""
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

def _mirror(root: Path) -> None:
    """A scratch root whose reports/ links to the repository's stage outputs, minus the report's own."""
    reports = root / "reports"
    (reports / "figures").mkdir(parents=True)
    for item in (REPO / "reports").iterdir():
        if item.name not in OUTPUTS and item.name != "figures":
            (reports / item.name).symlink_to(item)
    for item in (REPO / "reports" / "figures").iterdir():
        if item.name != "capstone":
            (reports / "figures" / item.name).symlink_to(item)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from agentrl.core.config import SECTIONS, load_params
    from agentrl.report.build import build
    root = tmp_path_factory.mktemp("capstone_root")
    _mirror(root)
    build(load_params([s for s in SECTIONS if s != "run"] + ["run"], REPO / "params.yaml"), root)
    reports = root / "reports"
    return {"root": root, "markdown": (reports / "capstone.md").read_text(),
            "sources": json.loads((reports / "capstone_sources.json").read_text())}


def test_rebuild_is_byte_identical_to_the_committed_report(built):
    for name in OUTPUTS:
        assert (built["root"] / "reports" / name).read_bytes() == (REPO / "reports" / name).read_bytes(), name
    committed = sorted(p.name for p in (REPO / "reports/figures/capstone").glob("*.png"))
    for name in committed:
        assert (built["root"] / "reports/figures/capstone" / name).read_bytes() == \
            (REPO / "reports/figures/capstone" / name).read_bytes(), name


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
    from agentrl.report.sources import fmt_value
    from agentrl.tracking.audit import extract
    entries = built["sources"]["entries"]
    assert entries and built["sources"]["count"] == len(entries)
    for e in entries:
        assert e["text"] in built["markdown"], e
        file, path = e["source"].rsplit(":", 1)
        data = json.loads((built["root"] / file).read_text())
        assert fmt_value(extract(data, path, file), e["format"]) == e["text"], e


@pytest.mark.slow
def test_ten_random_numbers_trace_with_audit(built):
    from agentrl.report.sources import fmt_value
    entries = built["sources"]["entries"]
    picked = random.Random(0).sample(entries, min(N_AUDITED, len(entries)))
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "MLFLOW_TRACKING_URI")}
    for e in picked:
        out = subprocess.run([sys.executable, "-m", "agentrl", "audit", e["source"]], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode in (0, 1), f"audit {e['source']} failed: {out.stderr}"  # 1 = stale (no data/): fine
        assert "stage        :" in out.stdout
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


def test_a_log_axis_with_only_its_threshold_gets_limits_computed_here():
    """The dashboard's gap panel when the gap is 0 at every step (the fixed kernels): nothing to draw but the
    threshold, and the limits are a decade either side of it, in Python floats, never matplotlib's CPU-dependent
    widening of an empty range; with data, a decade beyond the data and the threshold."""
    from agentrl.report.figures import _log_limits
    nan = float("nan")
    assert _log_limits([nan, nan, nan, nan, 1e-3]) == (1e-3 / 10, 1e-3 * 10)
    assert _log_limits([2e-6, nan, 5e-2, 1e-3]) == (2e-6 / 10, 5e-2 * 10)
