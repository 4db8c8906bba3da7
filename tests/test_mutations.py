"""Source mutations (agentrl.faults.mutations): each is one changed line of the real source, applied to a temporary
copy only, and preflight fails a named invariant for it. The full table (docs/preflight.md) is
`python -m agentrl.faults.mutations`; the slow test here runs the control and a subset."""
import hashlib
from pathlib import Path

import pytest

from agentrl.faults.mutations import BY_NAME, MUTATIONS, PACKAGE, apply, copy_package, markdown, run_mutation


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return h.hexdigest()


def test_every_mutation_is_one_changed_line_of_the_current_source(tmp_path):
    assert len(MUTATIONS) >= 10 and len(BY_NAME) == len(MUTATIONS)
    before = _digest(PACKAGE)
    copy_package(tmp_path)
    for m in MUTATIONS:
        path = tmp_path / "agentrl" / m.path
        original = path.read_text()
        assert original.count(m.old) == 1, m.name
        apply(m, tmp_path)
        changed = [(a, b) for a, b in zip(original.splitlines(), path.read_text().splitlines()) if a != b]
        assert len(changed) == 1 and len(original.splitlines()) == len(path.read_text().splitlines()), m.name
        path.write_text(original)
    assert _digest(PACKAGE) == before, "a mutation touched the real source"


def test_a_mutation_whose_source_text_moved_is_refused(tmp_path):
    copy_package(tmp_path)
    m = BY_NAME["advantage_sign"]
    apply(m, tmp_path)
    with pytest.raises(ValueError, match="advantage_sign"):
        apply(m, tmp_path)


def test_the_table_names_what_fired_and_what_did_not():
    res = {"checks": ["a", "b"], "values": {"a": 0.5, "b": 0.0}, "failed": [1], "errors": {}, "margins": {"a": 50.0}}
    table = markdown({"control": {"failed": [], "errors": {}}, "advantage_sign": res,
                      "kl_sign": {"failed": [], "crashed": "boom"}})
    assert "1 `a` (0.5, 50x)" in table and "**none**" in table and "check crashed: boom" in table


SUBSET = ("advantage_sign", "clip_bounds_swapped")


def test_preflight_catches_a_subset_of_mutations_and_passes_the_unmutated_copy(rl_base, tok, tmp_path):
    from agentrl.model.checkpoints import save_policy
    model = tmp_path / "base.pt"
    save_policy(model, rl_base, tok.hash)
    control = run_mutation(None, str(model), threads=2)
    assert control["failed"] == [] and control["errors"] == {}, control
    for name in SUBSET:
        res = run_mutation(BY_NAME[name], str(model), threads=2)
        assert set(res["failed"]) >= BY_NAME[name].expect, (name, res)
