"""Studies outside the default pipeline: `python -m agentrl study <name>` summarizes runs a matrix stage made.

length-bias   the length pair at the seeds of `length.seeds` (stage length_pair, data/length_study/seed-<s>.json)
              together with the catalogue's own pair (reports/faults.json) -> reports/studies/length_bias.json
              and a markdown table on stdout (docs/length_bias.md quotes it)
"""
from __future__ import annotations

import sys

from agentrl.core.artifacts import LENGTH_STUDY_DIR, REPORTS, read_json, write_json


def length_bias() -> int:
    from agentrl.faults.length import length_study, length_sweep_note
    rows = [read_json(p) for p in sorted(LENGTH_STUDY_DIR.glob("seed-*.json"), key=lambda p: int(p.stem[5:]))]
    if not rows:
        print("error: no length_pair results in data/length_study/; run e.g. "
              "`dvc exp run -S 'length.seeds=[1,2,3,4,5]'` first", file=sys.stderr)
        return 2
    faults = read_json(REPORTS / "faults.json")
    main = faults["signatures"].get("length_bias")
    seed = faults["base_config"]["seed"]
    out = length_study(rows, main, seed)
    write_json(REPORTS / "studies" / "length_bias.json", out)
    print(length_sweep_note(rows, seed, main))
    print()
    print(f"across seeds: {out['across_seeds']['detail']}")
    return 0


STUDIES = {"length-bias": length_bias}
