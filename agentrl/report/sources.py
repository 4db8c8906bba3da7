"""Every number in the report is read from a stage output and formatted by `Sources`, which records (text,
`<file>.json:<dotted.path>`, format) in order; the list is written to reports/capstone_sources.json, and
`python -m agentrl audit <source>` answers for any of them."""
from __future__ import annotations

import math
from typing import Any

from agentrl.tracking.audit import extract


def fmt_value(value: Any, fmt: str) -> str:
    """Text of one reported value. `fmt` is a Python format spec (".3f", "+.3f", ".0%", ".2e", "d", "g") or one of:
    "str" (as written in params.yaml: true/false, null, [a, b], {k: v}), "yesno", "passfail", "list"
    (comma-separated, "none" when empty), "sha12" (first 12 characters). None is "n/a" in every other format."""
    if fmt == "str":
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(fmt_value(v, "str") for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {fmt_value(v, 'str')}" for k, v in value.items()) + "}"
        return str(value)
    if value is None:
        return "n/a"
    if fmt == "yesno":
        return "yes" if value else "no"
    if fmt == "passfail":
        return "pass" if value else "FAIL"
    if fmt == "list":
        return ", ".join(fmt_value(v, "str") for v in value) if value else "none"
    if fmt == "sha12":
        return str(value)[:12]
    if isinstance(value, float) and not math.isfinite(value):
        return "n/a"
    return format(value, fmt)


class Sources:
    """Formats values read from loaded stage outputs and records where each came from, in order."""

    def __init__(self, docs: dict[str, Any]):
        self.docs = docs
        self.entries: list[dict] = []

    def has(self, file: str, path: str) -> bool:
        try:
            self.get(file, path)
            return True
        except Exception:
            return False

    def get(self, file: str, path: str) -> Any:
        if file not in self.docs or self.docs[file] is None:
            raise KeyError(f"{file} not loaded")
        return extract(self.docs[file], path, file)

    def __call__(self, file: str, path: str, fmt: str = ".3f") -> str:
        text = fmt_value(self.get(file, path), fmt)
        self.entries.append({"text": text, "source": f"{file}:{path}", "format": fmt})
        return text

    def ci(self, file: str, lo: str, hi: str, fmt: str = ".3f") -> str:
        return f"[{self(file, lo, fmt)}, {self(file, hi, fmt)}]"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"] + \
        ["| " + " | ".join(r) + " |" for r in rows] + [""]
