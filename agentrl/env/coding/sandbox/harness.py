"""What runs inside the sandbox after `boot` has locked it down: a script as `__main__`, a small pytest-compatible
test runner, or the hidden-test probe of the grader.

Standard library only (no site-packages inside). The probe reports the candidate function's *outputs* on the
hidden inputs, never a verdict: the expected values stay outside the sandbox and the trusted side compares, so a
program that patches this harness, the test functions or its own exit cannot report a pass it did not compute.
Importing this module does nothing.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import sys
import time
import traceback

WORKDIR = "/sandbox"


def _import_file(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------- python FILE.py

def run_script(path: str, argv: list) -> int:
    import runpy
    sys.argv = [path, *argv]
    try:
        runpy.run_path(os.path.join(WORKDIR, path), run_name="__main__")
    except SystemExit:
        raise
    except BaseException:
        etype, value, tb = sys.exc_info()
        tb = tb.tb_next.tb_next if tb and tb.tb_next else tb   # drop this function's and runpy's own frame
        traceback.print_exception(etype, value, tb)
        return 1
    return 0


# ---------------------------------------------------------------- pytest

def _failing_line(exc: BaseException, filename: str) -> str:
    """`file:line: source` of the deepest frame in the test file, as pytest points at the failing line."""
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.basename(frame.filename) == filename:
            found = f"{filename}:{frame.lineno}: {frame.line}"
    return found


def collect(targets: list[str]) -> list[tuple[str, str | None]]:
    """(file, test name or None for every test) for each target: `FILE.py`, `FILE.py::test_x`, or none = every
    test_*.py / *_test.py in the directory."""
    if not targets:
        names = sorted(n for n in os.listdir(WORKDIR)
                       if n.endswith(".py") and (n.startswith("test_") or n.endswith("_test.py")))
        return [(n, None) for n in names]
    out = []
    for t in targets:
        file, _, test = t.partition("::")
        out.append((file, test or None))
    return out


def run_tests(targets: list[str], verbose: bool, exitfirst: bool) -> int:
    start = time.perf_counter()
    items, errors = [], []
    for file, only in collect(targets):
        if not os.path.isfile(os.path.join(WORKDIR, file)):
            errors.append(f"ERROR: file or directory not found: {file}")
            continue
        try:
            module = _import_file(os.path.join(WORKDIR, file), file[:-3].replace("/", "."))
        except BaseException as exc:   # SystemExit at import too: a collection error, never a pass
            errors.append(f"ERROR collecting {file} - {_short_error(exc)}")
            continue
        tests = [(n, f) for n, f in vars(module).items() if n.startswith("test") and callable(f)]
        if only is not None:
            tests = [(n, f) for n, f in tests if n == only]
            if not tests:
                errors.append(f"ERROR: not found: {file}::{only}")
        items += [(file, n, f) for n, f in tests]
    print(f"collected {len(items)} item{'s' if len(items) != 1 else ''}")
    if errors:
        print("\n".join(errors))
        print(f"{len(errors)} error{'s' if len(errors) != 1 else ''} during collection")
        return 2
    passed, failures = 0, []
    for file, name, fn in items:
        try:
            fn()
        except BaseException as exc:
            failures.append((file, name, exc))
            if verbose:
                print(f"{file}::{name} FAILED")
            if exitfirst:
                break
        else:
            passed += 1
            if verbose:
                print(f"{file}::{name} PASSED")
    for file, name, exc in failures:
        where = _failing_line(exc, file)
        print(f"FAILED {file}::{name} - {_short_error(exc)}" + (f"\n    {where}" if where else ""))
    counts = ", ".join(p for p in (f"{len(failures)} failed" if failures else "",
                                   f"{passed} passed" if passed else "") if p) or "no tests ran"
    print(f"{counts} in {time.perf_counter() - start:.2f}s")
    if not items:
        return 5
    return 1 if failures else 0


# ---------------------------------------------------------------- the grader's probe

def encode(value, depth: int = 0):
    """A tagged JSON tree of a result of plain built-in types (exact types: no subclass, no custom __eq__);
    anything else raises TypeError."""
    if depth > 20:
        raise TypeError("nested too deeply")
    kind = type(value)
    if value is None:
        return ["none", None]
    if kind is bool:
        return ["bool", value]
    if kind is int:
        return ["int", str(value)]
    if kind is float:
        return ["float", value if math.isfinite(value) else repr(value)]
    if kind is str:
        return ["str", value]
    if kind in (list, tuple):
        return [kind.__name__, [encode(v, depth + 1) for v in value]]
    if kind is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"unsupported result type {kind.__name__}")


def probe(module_file: str, function: str, cases: list, nonce: str) -> int:
    """Call `function` from `module_file` on each argument list; print one line `nonce JSON` with the outputs."""
    outputs = []
    try:
        module = _import_file(os.path.join(WORKDIR, module_file), module_file[:-3])
        fn = getattr(module, function)
    except BaseException as exc:
        outputs = [["error", f"import: {_short_error(exc)}"]] * len(cases)
    else:
        for args in cases:
            try:
                outputs.append(["ok", encode(fn(*copy.deepcopy(args)))])
            except BaseException as exc:   # SystemExit and KeyboardInterrupt fail the case, not the probe
                outputs.append(["error", _short_error(exc)[:200]])
    line = nonce + " " + json.dumps(outputs)
    sys.stdout.flush()
    os.write(1, ("\n" + line + "\n").encode())
    return 0


def main(args: dict) -> int:
    sys.path.insert(0, WORKDIR)
    os.chdir(WORKDIR)
    mode = args["mode"]
    if mode == "script":
        return run_script(args["path"], args.get("argv", []))
    if mode == "pytest":
        return run_tests(args["targets"], args.get("verbose", False), args.get("exitfirst", False))
    if mode == "probe":
        return probe(args["module"], args["function"], args["cases"], args["nonce"])
    raise ValueError(f"mode: unknown value {mode!r}; allowed: script, pytest, probe")
