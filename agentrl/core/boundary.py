"""The error boundary of every entry point (each CLI verb, each stage): what a failure looks like to the user.

    a problem the user can fix (UserError: a bad param or argument, a missing or corrupted input, a store that
    does not answer)                         -> one line `error: ...` on stderr, exit code 2
    the machine refused (disk full, read-only, no permission)
                                             -> one line naming the file and what to do, exit code 1
    anything else                            -> one line naming the exception and a log file that holds the
                                                traceback (AGENTRL_DEBUG=1: the traceback on stderr), exit code 1
    Ctrl-C (SIGINT)                          -> exit code 130
    SIGTERM                                  -> exit code 143
    SIGHUP (a closed terminal, SSH dropped)  -> exit code 129
    SIGQUIT (Ctrl-\\)                        -> exit code 131
    a fatal signal (SIGSEGV, SIGILL, SIGBUS) -> Python's faulthandler names it and the stack on stderr; the MLflow
                                                run it leaves RUNNING is closed KILLED by the next run of any stage

The four ending signals are raised as exceptions in the main thread (KeyboardInterrupt, `Terminated`), so whatever
is open on the way out (an MLflow run, a temporary file) is closed as interrupted. Once an entry point has recorded
its work as finished (`mark_finished`), a late signal no longer changes the outcome: the process exits 0 and says so.
"""
from __future__ import annotations

import contextlib
import errno
import faulthandler
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from agentrl.core.knobs import UserError

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 130, 143
DEBUG_ENV = "AGENTRL_DEBUG"           # 1: print the traceback of an unexpected error instead of logging it
LOG_DIR_ENV = "AGENTRL_LOG_DIR"       # where tracebacks go (default: <tmp>/agentrl-logs)
MAX_LINE = 400                        # a message longer than this is cut (a 10,000-character key stays one line)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)   # SIGHUP: a closed terminal, a dropped SSH
SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP: the terminal closed", signal.SIGQUIT: "SIGQUIT"}
_OS_ADVICE = {errno.ENOSPC: "free space on that filesystem and run again",
              errno.EDQUOT: "free space (disk quota) and run again",
              errno.EROFS: "the filesystem is read-only: run from a writable checkout or point the path elsewhere",
              errno.EIO: "the disk reported an I/O error (dmesg says which): check it and run again",
              errno.EACCES: "check the permissions of that path",
              errno.EPERM: "check the permissions and attributes of that path (ls -l, lsattr: immutable?)"}
_state = {"finished": False, "signalled": False, "guarded": False, "holding": False, "pending": None, "ending": False,
          "reason": None}


class Terminated(BaseException):
    """SIGTERM, SIGHUP or SIGQUIT, raised in the main thread so the work in progress is closed as killed."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(f"signal {signum}")
        self.signum = signum


def one_line(text: str, limit: int = MAX_LINE) -> str:
    """The first non-empty line of `text`, cut to `limit` characters."""
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return line if len(line) <= limit else f"{line[:limit]}... ({len(line):,} characters)"


def log_dir() -> Path:
    return Path(os.environ.get(LOG_DIR_ENV) or Path(tempfile.gettempdir()) / "agentrl-logs")


def _write_log(name: str, exc: BaseException) -> Path | None:
    path = log_dir() / f"{name.replace('/', '_').replace('@', '-')}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{name}: {' '.join(sys.argv)}\n" + "".join(traceback.format_exception(exc)))
        return path
    except OSError:
        return None


def describe(exc: BaseException, name: str = "agentrl") -> tuple[int, str]:
    """(exit code, the one line the user sees) for an exception; computed once per exception, so an MLflow run
    closed on the way out carries the same line (and log file) the user reads."""
    known = getattr(exc, "_agentrl_outcome", None)
    if known is not None:
        return known
    if isinstance(exc, KeyboardInterrupt):
        outcome = EXIT_INTERRUPTED, f"{name}: interrupted (SIGINT)"
    elif isinstance(exc, Terminated):
        why = _state["reason"] or SIGNAL_NAMES.get(exc.signum, f"signal {exc.signum}")
        outcome = 128 + exc.signum, f"{name}: terminated ({why})"
    elif isinstance(exc, UserError):   # a kind that is no input of the user's says its own code (a lost store: 1)
        outcome = getattr(exc, "exit_code", EXIT_BAD_INPUT), one_line(str(exc)) or type(exc).__name__
    elif isinstance(exc, OSError) and exc.errno in _OS_ADVICE:
        where = exc.filename or "its output"
        outcome = EXIT_FAILED, one_line(f"{name}: cannot write {where}: {exc.strerror}; {_OS_ADVICE[exc.errno]}")
    else:
        first = one_line(str(exc), 200)
        if os.environ.get(DEBUG_ENV):
            traceback.print_exception(exc, file=sys.stderr)
            outcome = EXIT_FAILED, f"{name}: unexpected {type(exc).__name__}" + (f": {first}" if first else "")
        else:
            log = _write_log(name, exc)
            outcome = EXIT_FAILED, (f"{name}: unexpected {type(exc).__name__}" + (f": {first}" if first else "")
                                    + (f" (traceback: {log}; {DEBUG_ENV}=1 prints it)" if log else ""))
    with contextlib.suppress(AttributeError, TypeError):
        exc._agentrl_outcome = outcome
    return outcome


def _raise_signal(signum, frame):
    """The first ending signal becomes an exception (inside `signals_blocked`, when the block ends); later ones (DVC
    and the terminal both forward Ctrl-C) are ignored while the first unwinds, so the cleanup it triggers is not
    itself cut short (SIGKILL still stops it)."""
    if _state["signalled"]:
        return
    if _state["holding"]:
        _state["pending"] = _state["pending"] or signum
        return
    if frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        _resend_soon(signum)   # importlib runs weakref callbacks (its module locks'): an exception raised in one is
        return                 # printed as "Exception ignored" and dropped, and the signal would be lost
    _raise_now(signum)


def _resend_soon(signum: int, delay: float = 0.01):
    """The same signal to this process again after `delay` seconds (from a timer thread: the handler runs again on
    the main thread, at a point where an exception can propagate)."""
    import threading
    timer = threading.Timer(delay, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def _raise_now(signum: int):
    _state["signalled"], _state["pending"] = True, None
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


@contextlib.contextmanager
def signals_as_exceptions():
    """SIGTERM -> Terminated and SIGINT -> KeyboardInterrupt for the duration (main thread only: elsewhere
    Python cannot set handlers and the caller's stay)."""
    try:
        before = {sig: signal.signal(sig, _raise_signal) for sig in SIGNALS}
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def end_quietly_on_signals(name: str, on_end=None) -> None:
    """Until the next `guard` takes over: an ending signal prints the boundary's one line and exits with its code at
    once (after `on_end()`, with the signals held back). For the span between an entry point's early check and its
    own boundary (a stage script importing torch, seconds), where nothing has been written and no run is open, and
    where Python's defaults would print a KeyboardInterrupt traceback (SIGINT) or end silently (SIGTERM, SIGHUP,
    SIGQUIT)."""
    def ended(signum, frame):
        if _state["guarded"] or _state["ending"]:   # a boundary decided the outcome, or this one is ending already
            return
        _state["ending"] = True
        if on_end is not None:
            with signals_blocked(), contextlib.suppress(BaseException):
                on_end()
        line = describe(KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum), name)[1]
        with contextlib.suppress(OSError, ValueError):
            os.write(2, f"error: {line} before it started; nothing was written\n".encode())
        os._exit(128 + signum)
    _state.update(guarded=False, ending=False)
    with contextlib.suppress(ValueError):   # not the main thread: the caller's handlers stay
        for sig in SIGNALS:
            signal.signal(sig, ended)


@contextlib.contextmanager
def signals_blocked(block: bool = True):
    """Hold the ending signals back while a block runs (a run being created and taken charge of, a status
    recorded whole): a signal that comes meanwhile acts when the block ends. Held at the system (this thread's
    mask) and in Python (the handler only notes it: the system may hand a signal to any thread whose mask lets it
    through, a library's among them). `block=False` lets them act for a while inside a block (a wait between two
    attempts, a signal noted already acting at once); either way what was there before is restored."""
    holding = _state["holding"]
    _state["holding"] = block
    try:
        before = signal.pthread_sigmask(signal.SIG_BLOCK if block else signal.SIG_UNBLOCK, SIGNALS)
    except (AttributeError, ValueError, OSError):   # not POSIX
        before = None
    try:
        if not block and _state["pending"]:
            _raise_now(_state["pending"])
        yield
    finally:
        if before is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
        _state["holding"] = holding
        if not holding and _state["pending"] and not _state["signalled"]:
            _raise_now(_state["pending"])


def terminate_self(reason: str) -> None:
    """End this process as SIGTERM ends it (the work in progress closed as killed), its line saying `reason`; for a
    thread that sees the process has nothing left to work for."""
    _state["reason"] = reason
    os.kill(os.getpid(), signal.SIGTERM)


def mark_finished() -> None:
    """The entry point's work is recorded as finished: a signal from now on does not turn it into a failure."""
    _state["finished"] = True


def guard(name: str, fn, *args, **kwargs) -> int:
    """Run fn(*args, **kwargs) inside the boundary; return its exit code (None is 0) after printing the one line a
    failure deserves (see the module doc)."""
    _state.update(finished=False, signalled=False, guarded=True, holding=False, pending=None, ending=False,
                  reason=None)
    if not faulthandler.is_enabled():
        with contextlib.suppress(OSError, ValueError, AttributeError, RuntimeError):
            faulthandler.enable(all_threads=False)
    try:
        with signals_as_exceptions():
            code = fn(*args, **kwargs)
            sys.stdout.flush()   # output that cannot be written (a full disk under `> file`) fails here, not at exit
        return int(code or 0)
    except SystemExit as exc:   # argparse and friends already printed their line
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(f"error: {one_line(str(exc.code))}", file=sys.stderr)
        return EXIT_FAILED
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, Terminated)) and _state["finished"]:
            print(f"warning: {name}: a signal arrived after the work was recorded as finished; ignored",
                  file=sys.stderr)
            return 0
        code, line = describe(exc, name)
        if isinstance(exc, OSError) and exc.filename is None:
            _drop_stdout()
        print(f"error: {line}", file=sys.stderr)
        return code
    finally:
        _forget_interrupt_mark()
        sys.stderr.flush()


def _forget_interrupt_mark() -> None:
    """CPython marks the interpreter to end by SIGINT (exit status -2 instead of the boundary's 130) when a
    KeyboardInterrupt leaves code run from a string (`eval`/`exec` of source text: collections.namedtuple builds its
    classes that way, so a Ctrl-C during an import can land there), even when the exception is then caught. Every
    exception is handled here, so the mark is stale; evaluating a string clears it (CPython resets it per eval)."""
    eval("None")


def _drop_stdout() -> None:
    """After stdout could not be written, send what is still buffered to /dev/null, so the interpreter's exit does
    not fail on it a second time with a traceback."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def check_threads(threads: int) -> None:
    """A thread count above the machine's cores is allowed (results depend on the count, not the machine) but
    slow: one warning line."""
    cores = os.cpu_count() or 1
    if threads > cores:
        print(f"warning: run.threads={threads} exceeds this machine's {cores} cores: the run will be slower (results "
              "depend on the thread count, so keep it to reproduce a run)", file=sys.stderr)
