"""What one sandboxed execution costs: `python -m agentrl.env.coding.cost [--runs 20]`.

Median wall time of a trivial script, of the public tests of a task (`pytest`) and of the hidden-test grader, each
in a fresh sandbox, against the same interpreter started bare (`python -I -S -c pass`, no sandbox), side by side
in one run; then the sandbox time of one GRPO step of the tools lab (one test run and one grade per episode, the
scripted expert's count) at the trainer's default 64 episodes."""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time


def _median_ms(fn, runs: int) -> float:
    fn()   # warm: the interpreter probe, the page cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(runs: int = 20) -> dict:
    import os

    from agentrl.env.coding.grader import grade
    from agentrl.env.coding.repository import Repository
    from agentrl.env.coding.sandbox.interpreter import discover
    from agentrl.env.coding.sandbox.launch import run
    from agentrl.env.tasks import task_by_name
    task = task_by_name("minmax/largest")
    repo = Repository.for_task(task, "kilo")
    exe = discover().executable
    return {
        "bare interpreter (no sandbox)": _median_ms(
            lambda: subprocess.run([exe, "-I", "-S", "-c", "pass"], check=True, env={}), runs),
        "python FILE.py": _median_ms(
            lambda: run({"main.py": "print('hi')\n"}, {"mode": "script", "path": "main.py"}), runs),
        "pytest (2 public tests)": _median_ms(
            lambda: run(dict(repo.files), {"mode": "pytest", "targets": []}), runs),
        "grade (5 hidden + 2 public cases)": _median_ms(
            lambda: grade(repo.files["kilo.py"], "kilo", task.hidden + task.public), runs),
        "_cpus": os.cpu_count(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.env.coding.cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per row (after one warm-up)")
    parser.add_argument("--episodes", type=int, default=64, help="episodes per training step")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.episodes < 1:
        parser.error("--runs and --episodes: at least 1")
    rows = measure(args.runs)
    cpus = rows.pop("_cpus")
    print(f"sandbox cost: median of {args.runs} runs each, {cpu_name()} ({cpus} CPUs)")
    for name, ms in rows.items():
        print(f"  {name:36s} {ms:7.1f} ms")
    per_episode = rows["pytest (2 public tests)"] + rows["grade (5 hidden + 2 public cases)"]
    print(f"  one episode (a test run + the grade) {per_episode:7.1f} ms; a step of {args.episodes} episodes "
          f"{per_episode * args.episodes / 1e3:.2f} s in series")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
