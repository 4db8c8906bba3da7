"""`python -m agentrl sweep STAGE [--address ADDR] [--max-parallel N]`: a matrix stage's missing or stale instances
run as Ray tasks and recorded by DVC as if `dvc repro` had run them (docs/sweep.md).

    plan      DVC names the instances to run (agentrl.pipeline.sweep.plan); upstream stages must be current
    ship      the code and params.yaml go to every node as the job's runtime_env working_dir; each input file
              goes once into Ray's object store; no node needs the repository or a shared filesystem
    run       one task per instance, num_cpus = run.threads (a 2-core node runs one 2-thread instance at a time),
              at most --max-parallel in flight; the stage runs on the node exactly as under `dvc repro`
              (agentrl.pipeline.sweep.worker) and its outputs come back as bytes
    record    for each finished instance, in the driver, with Ctrl-C held off: its outputs moved into place
              (whole, by rename), its MLflow run replayed into the project's store (tagged with the sweep id), its
              provenance record written, then `dvc commit -f` of that instance alone
    faults    a failed or lost instance is tried once more, then reported with its error while the others finish;
              Ctrl-C or SIGTERM cancels what runs, keeps what was recorded, and stops the Ray it started

Ray is started locally (and stopped) by default; --address or $RAY_ADDRESS joins a running cluster.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from agentrl.pipeline.sweep.plan import Instance, SweepError, check_stage, commit, plan
from agentrl.pipeline.sweep.worker import CODE, read_tree, reap_orphans, run_instance, write_tree
from agentrl.tracking.deferred import replay_run
from agentrl.tracking.provenance import versions
from agentrl.tracking.store import StoreError, probe, tracking_uri

ATTEMPTS = 2            # a failed or lost instance is run once more
PROGRESS_EVERY = 30.0   # seconds between progress lines when nothing finishes
PROBE_TIMEOUT = 3.0
JOIN_TIMEOUT = 45.0    # seconds for ray.init to join a cluster whose address answers
LOCAL_OBJECT_STORE = 256 * 1024 ** 2


def _clock(seconds: float) -> str:
    seconds = int(round(max(0.0, seconds)))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _one_line(exc: BaseException) -> str:
    """The gist of an exception: its type and last line, up to the first sentence's end (Ray's run long)."""
    text = str(getattr(exc, "cause", None) or exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    gist = lines[-1].split(". ", 1)[0] if lines else ""
    return f"{type(exc).__name__}: {gist}".rstrip(": ")


def check_address(address: str) -> None:
    """One line, within seconds, when nothing answers at a cluster address (host:port or ray://host:port)."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise SweepError(f"Ray address {address!r}: expected host:port or ray://host:port")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT):
            return
    except OSError as exc:
        raise SweepError(f"Ray cluster at {address} unreachable ({exc.strerror or type(exc).__name__}); start it "
                         "with `ray start --head` or fix --address / RAY_ADDRESS") from None


_STOP = threading.Event()


def _stop_requested(signum, frame):
    """Ctrl-C and SIGTERM: raise KeyboardInterrupt, and also set a flag that the loop checks after every wait:
    an interrupt that arrived while ray.wait blocked has been seen not to come out of it as KeyboardInterrupt."""
    _STOP.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM wait until an instance is recorded whole (outputs, MLflow run, dvc.lock entry)."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _stage_code(root: Path, dest: Path) -> Path:
    """The working_dir every node receives: the code directories, dvc.yaml and params.yaml, nothing else."""
    for name in CODE:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.is_file():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def install_outputs(root: Path, scratch: Path, inst: Instance, files: dict[str, bytes]) -> None:
    """Put an instance's outputs where `dvc repro` writes them, each whole: written beside the repository (same
    filesystem), then renamed into place; a previous version is moved aside first and deleted after."""
    new, old = scratch / "new" / inst.name, scratch / "old" / inst.name
    for path in (new, old):
        shutil.rmtree(path, ignore_errors=True)
    write_tree(new, files)
    for out in inst.outs:
        target = root / out
        if target.exists() or target.is_symlink():
            (old / out).parent.mkdir(parents=True, exist_ok=True)
            os.replace(target, old / out)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(new / out, target)
    shutil.rmtree(scratch / "new" / inst.name, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


class Sweep:
    """The scheduling loop: submit up to the cluster's capacity, record what finishes, retry once, report."""

    def __init__(self, ray, root: Path, scratch: Path, sweep_id: str, todo: list[Instance],
                 max_parallel: int | None):
        self.ray, self.root, self.scratch, self.id = ray, root, scratch, sweep_id
        self.todo, self.queue = list(todo), list(todo)
        self.max_parallel = max_parallel
        self.pending: dict = {}          # ObjectRef -> (instance, attempt, submitted at)
        self.attempts: dict[str, int] = {}
        self.done: list[str] = []
        self.failed: dict[str, str] = {}
        self.events: list[str] = []      # what happened since the last progress line
        self.durations: list[float] = []
        self.started = self.last_progress = time.time()
        self.task = ray.remote(run_instance)
        self.inputs = {path: ray.put(read_tree(root, path)) for path in sorted({p for i in todo for p in i.inputs})}
        self.versions = versions()

    def capacity(self) -> int:
        threads = max(i.threads for i in self.todo)
        slots = sum(int(n["Resources"].get("CPU", 0) // threads) for n in self.ray.nodes() if n.get("Alive"))
        return slots if self.max_parallel is None else min(slots, self.max_parallel)

    def progress(self, event: str = "") -> None:
        left, running = len(self.queue), len(self.pending)
        elapsed = time.time() - self.started
        eta = ""
        if self.durations and (left or running):
            mean = sum(self.durations) / len(self.durations)
            parallel = max(1, min(self.capacity() or 1, left + running))
            in_flight = sum(time.time() - t for _, _, t in self.pending.values()) / max(1, running)
            eta = f", ETA {_clock(mean * (left + running) / parallel - min(in_flight, mean))}"
        print(f"sweep: {len(self.done)}/{len(self.todo)} done, {running} running, {left} left"
              + (f", {len(self.failed)} failed" if self.failed else "")
              + f"; {_clock(elapsed)} elapsed{eta}" + (f"  [{event}]" if event else ""), flush=True)
        self.last_progress = time.time()

    def submit(self, inst: Instance) -> None:
        attempt = self.attempts.get(inst.name, 0) + 1
        self.attempts[inst.name] = attempt
        spec = {"name": inst.name, "cmd": inst.cmd, "outs": list(inst.outs), "sweep": self.id}
        ref = self.task.options(num_cpus=inst.threads, max_retries=0, name=inst.name).remote(
            spec, *[self.inputs[p] for p in inst.inputs])
        self.pending[ref] = (inst, attempt, time.time())

    def _log(self, inst: Instance, attempt: int, text: str) -> Path:
        path = self.scratch / "logs" / f"{inst.name}.{attempt}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def _replay(self, inst: Instance, attempt: int, result: dict) -> None:
        if not result.get("record", {}).get("run.json"):
            return
        directory = self.scratch / "runs" / f"{inst.name}.{attempt}"
        shutil.rmtree(directory, ignore_errors=True)
        write_tree(directory, result["record"])
        replay_run(directory, {"sweep": self.id, "sweep.host": result.get("host", "?"),
                               "sweep.attempt": str(attempt)}, self.root)
        shutil.rmtree(directory, ignore_errors=True)
        record = result["record"].get(f"artifacts/provenance/{inst.name}.json")
        ran = json.loads(record).get("versions", {}) if record else {}
        differ = {k: v for k, v in ran.items() if self.versions.get(k) != v}
        if differ:
            print(f"sweep: warning: {inst.name} ran with " + ", ".join(f"{k} {v}" for k, v in differ.items())
                  + " (this machine: " + ", ".join(f"{k} {self.versions.get(k)}" for k in differ) + ")", flush=True)

    def finish(self, ref) -> None:
        inst, attempt, submitted = self.pending.pop(ref)
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:   # the worker's own code raised
            result = {"ok": False, "error": f"worker error: {_one_line(exc)}", "log": str(exc)}
        except self.ray.exceptions.RayError as exc:       # a lost node or worker
            result = {"ok": False, "error": f"lost: {_one_line(exc)}", "log": str(exc)}
        log = self._log(inst, attempt, result.get("log", ""))
        with _signals_held():
            write_tree(self.root, result.get("side", {}))
            if result["ok"]:
                try:
                    install_outputs(self.root, self.scratch, inst, result["outs"])
                    self._replay(inst, attempt, result)
                    commit(self.root, inst.name)
                except Exception as exc:
                    result = {"ok": False, "error": f"recording failed: {_one_line(exc)}", "final": True}
            else:
                with contextlib.suppress(Exception):
                    self._replay(inst, attempt, result)
            if result["ok"]:
                self.done.append(inst.name)
                self.durations.append(result.get("seconds") or time.time() - submitted)
                self.events.append(f"{inst.name} recorded ({_clock(result.get('seconds', 0))}, "
                                   f"{result.get('host', '?')})")
            elif attempt < ATTEMPTS and not result.get("final"):
                self.queue.insert(0, inst)
                self.events.append(f"{inst.name} failed, trying again: {result['error']}")
            else:
                self.failed[inst.name] = f"{result['error']} (log: {log.relative_to(self.root)})"
                self.events.append(f"{inst.name} failed: {result['error']}")

    def run(self) -> None:
        self.events.append(f"{len(self.todo)} to run as Ray tasks of {max(i.threads for i in self.todo)} CPUs, "
                           f"sweep id {self.id}")
        while self.queue or self.pending:
            cap = self.capacity()
            if cap == 0:
                for inst in self.queue + [p[0] for p in self.pending.values()]:
                    self.failed[inst.name] = f"no node left with {inst.threads} CPUs"
                self.cancel()
                self.queue, self.pending = [], {}
                break
            while self.queue and len(self.pending) < cap:
                self.submit(self.queue.pop(0))
            for event in self.events:
                self.progress(event)
            self.events = []
            ready, _ = self.ray.wait(list(self.pending), num_returns=1, timeout=5.0)
            if _STOP.is_set():
                raise KeyboardInterrupt
            for ref in ready:
                self.finish(ref)
            if not ready and time.time() - self.last_progress >= PROGRESS_EVERY:
                self.progress()
        for event in self.events:
            self.progress(event)

    def cancel(self) -> None:
        for ref in list(self.pending):
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)


def _start_ray(address: str | None, code: Path, temp_dir: Path | None):
    import ray
    logging.getLogger("ray").setLevel(logging.ERROR)
    kwargs = {"runtime_env": {"working_dir": str(code)}, "logging_level": logging.ERROR, "log_to_driver": False,
              "namespace": "agentrl-sweep"}
    if address is None:
        kwargs.update(address="local", include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE,
                      _temp_dir=str(temp_dir))
    else:
        kwargs["address"] = address
    def give_up():  # a port that accepts connections but is no Ray head: ray.init would wait for minutes
        print(f"error: sweep: the Ray cluster at {address} did not answer within {JOIN_TIMEOUT:.0f} s (is it the "
              "head's GCS port, as printed by `ray start --head`?)", file=sys.stderr, flush=True)
        shutil.rmtree(code, ignore_errors=True)
        os._exit(2)
    watchdog = threading.Timer(JOIN_TIMEOUT, give_up)
    watchdog.daemon = True
    if address is not None:
        watchdog.start()
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        ray.shutdown()
        raise SweepError(f"cannot join the Ray cluster at {address}: {_one_line(exc)}") from None
    finally:
        watchdog.cancel()
    return ray


def main(stage: str, address: str | None = None, max_parallel: int | None = None, root: Path | str = ".") -> int:
    root = Path(root).resolve()
    address = address or os.environ.get("RAY_ADDRESS") or None
    try:
        check_stage(stage, root)
        if address:
            check_address(address)
        instances, todo = plan(stage, root)
        if not instances:
            print(f"sweep {stage}: the matrix has no instances (its lists in params.yaml are empty)")
            return 0
        if not todo:
            print(f"sweep {stage}: all {len(instances)} instances are current (dvc status is clean); nothing to run")
            return 0
        probe(tracking_uri(root))
    except (SweepError, StoreError) as exc:
        print(f"error: sweep: {exc}", file=sys.stderr)
        return 2
    sweep_id = f"sweep-{stage}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"
    scratch = root / ".dvc" / "tmp" / "sweep" / sweep_id
    temp_dir = None if address else Path(tempfile.mkdtemp(prefix="ray-"))
    print(f"sweep {stage}: {len(todo)} of {len(instances)} instances missing or stale; "
          + (f"joining the Ray cluster at {address}" if address else "starting a local Ray"), flush=True)
    _STOP.clear()
    previous = signal.signal(signal.SIGTERM, _stop_requested)
    signal.signal(signal.SIGINT, _stop_requested)
    ray, sweep, interrupted = None, None, False
    try:
        ray = _start_ray(address, _stage_code(root, scratch / "code"), temp_dir)
        if max(i.threads for i in todo) > max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]),
                                              default=0):
            raise SweepError(f"no node of the cluster has {max(i.threads for i in todo)} CPUs (run.threads)")
        sweep = Sweep(ray, root, scratch, sweep_id, todo, max_parallel)
        sweep.run()
    except SweepError as exc:
        print(f"error: sweep: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        interrupted = True
        print(f"sweep: interrupted; cancelling {len(sweep.pending) if sweep else 0} running instances (what was "
              "recorded stays recorded)", file=sys.stderr, flush=True)
        if sweep:
            sweep.cancel()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C must not cut the shutdown short
        try:
            if "ray" in sys.modules:   # also after a Ctrl-C inside ray.init
                sys.modules["ray"].shutdown()
            shutil.rmtree(scratch / "code", ignore_errors=True)
            for sub in ("new", "old", "runs"):
                shutil.rmtree(scratch / sub, ignore_errors=True)
            if temp_dir is not None:
                shutil.rmtree(temp_dir, ignore_errors=True)
            reap_orphans()   # scratch of this host's workers that were killed (the next worker would, too)
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous)
    return _summary(stage, instances, todo, sweep, interrupted)


def _summary(stage: str, instances: list, todo: list, sweep: Sweep | None, interrupted: bool) -> int:
    done = sweep.done if sweep else []
    failed = sweep.failed if sweep else {}
    wall = _clock(time.time() - sweep.started) if sweep else "0s"
    print(f"sweep {stage}: {len(done)} of {len(todo)} instances run and recorded in dvc.lock in {wall}"
          + (f", {len(failed)} failed" if failed else "") + (", interrupted" if interrupted else "")
          + f" ({len(instances) - len(todo)} were current)", flush=True)
    for name, error in failed.items():
        print(f"  {name}: {error}", file=sys.stderr)
    if done and not failed and not interrupted:
        print("sweep: next, `dvc repro` runs what depends on them (the instances themselves are current)")
    return 130 if interrupted else (1 if failed else 0)
