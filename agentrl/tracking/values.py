"""What MLflow accepts as a key or a value: keys made valid (and bounded, a hash keeping long ones distinct), values
cut to MLflow's limits, metrics finite floats, batches within MLflow's sizes."""
from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
from typing import Any

MAX_METRICS_PER_BATCH = 1000   # mlflow.utils.validation.MAX_METRICS_PER_BATCH / MAX_ENTITIES_PER_BATCH
MAX_PARAMS_TAGS_PER_BATCH = 100  # mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250

_BAD_KEY_CHARS = re.compile(r"[^\w.\- /]")


def _key(name: str) -> str:
    """A valid MLflow param/metric/tag key (alnum _ - . space /; no leading '/', no '..'; <= 250 chars)."""
    key = _BAD_KEY_CHARS.sub("_", str(name)).lstrip("/").replace("..", "__") or "_"
    if len(key) > MAX_KEY:
        key = key[:MAX_KEY - 17] + "~" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return key


def _value_text(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _metric_value(value: Any) -> float | None:
    """A finite float, or None for anything non-numeric (bool, str, None, ...) or non-finite."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, numbers.Number) and hasattr(value, "item"):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]
