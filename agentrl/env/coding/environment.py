"""The generic-tools environment: one episode on one task. `reset()` gives the chat messages (and `tools` the
schemas); `step(tool_call)` gives the tool's observation, or None when the episode has ended. A turn without a
tool call (`step(None, content)`) is the final answer; otherwise the episode ends after `max_turns` calls. Reward
1 iff the final `<fn>.py` passes every hidden test, graded in the sandbox."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from agentrl.env.base import EpisodeRecord
from agentrl.env.coding import calls
from agentrl.env.coding.bash import run_bash
from agentrl.env.coding.grader import grade
from agentrl.env.coding.repository import Repository
from agentrl.env.coding.sandbox.launch import Limits
from agentrl.env.coding.schemas import REPO_ROOT, TOOL_SCHEMAS, check_call
from agentrl.env.gym.environment import draw_operands, randomize_names
from agentrl.env.tasks import Task

SYSTEM_PROMPT = (
    f"You fix bugs in a small Python repository at {REPO_ROOT}. Use the tools to look at the code, change it and "
    "run its tests. When you are done, answer without calling a tool: that ends the episode, and the code is then "
    "checked against tests you cannot see.")
_CLAIM = re.compile(r"\b(fix(ed|es)?|pass(es|ed|ing)?|done|works?|working|resolved|solved|correct(ed)?)\b", re.I)
_DOUBT = re.compile(r"\b(not|n't|cannot|unable|fail(s|ed|ing)?|still|could ?not)\b", re.I)


def claims_success(answer: str) -> bool:
    """A final answer that says the bug is fixed or the tests pass, and does not also hedge or report a failure
    (a heuristic on the words; the lab reports it as such)."""
    return bool(_CLAIM.search(answer)) and not _DOUBT.search(answer)


def opening_messages(name: str) -> list[dict]:
    """The system and user messages an episode on the function `name` opens with."""
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"The function `{name}` in {REPO_ROOT}/{name}.py does not do what its tests in "
                                        f"{REPO_ROOT}/test_{name}.py expect. Fix it."}]


def new_info(task: Task, name: str) -> dict:
    return {"task": task.name, "family": task.family, "name": name, "turns": 0, "calls": [], "kinds": [],
            "failed": {kind: 0 for kind in calls.FAILED_KINDS}, "writes": 0, "edits": 0, "reads": 0,
            "test_runs": 0, "script_runs": 0, "answered": False, "answer": None, "claims_success": False,
            "hidden_pass": False, "public_pass": False, "grade": None, "false_success_claim": False}


@dataclass
class ToolsEnv:
    task: Task
    name: str
    max_turns: int = 6
    limits: Limits = field(default_factory=Limits)
    operands: dict | None = None   # operands under filler names in the file (agentrl.env.gym.environment)
    repo: Repository = None
    done: bool = False
    reward: float = 0.0
    info: dict = field(default_factory=dict)
    tools: list = field(default_factory=lambda: TOOL_SCHEMAS)

    def __post_init__(self):
        if not (isinstance(self.max_turns, int) and self.max_turns >= 1):
            raise ValueError(f"max_turns: must be an integer >= 1, got {self.max_turns!r}")
        self.repo = Repository.for_task(self.task, self.name, self.operands)
        self.info = new_info(self.task, self.name)

    @property
    def source_file(self) -> str:
        return f"{self.name}.py"

    def reset(self) -> list[dict]:
        return opening_messages(self.name)

    def step(self, tool_call: dict | None, content: str = "") -> str | None:
        """One assistant turn: a tool call (`{"name": ..., "arguments": {...}}`), or None for the final answer."""
        if self.done:
            raise RuntimeError("step() after the episode ended")
        info = self.info
        if tool_call is None:
            info["answered"], info["answer"] = True, content
            info["claims_success"] = claims_success(content)
            return self._finish()
        info["turns"] += 1
        result = self._call(tool_call)
        if result.failure:
            info["failed"][result.failure] += 1
        if info["turns"] >= self.max_turns:
            return self._finish()
        return result.text

    def _call(self, tool_call) -> calls.ToolResult:
        info = self.info
        try:
            name, args = check_call(tool_call)
        except ValueError as exc:
            info["calls"].append("invalid")
            info["kinds"].append("invalid")
            return calls.error(calls.MALFORMED, str(exc))
        info["calls"].append(name)
        info["kinds"].append({"Read": "read", "Edit": "edit", "Write": "edit"}.get(name, "run"))
        if name == "Read":
            info["reads"] += 1
            return calls.read(self.repo, args["file_path"], args.get("offset"), args.get("limit"))
        if name == "Edit":
            info["edits"] += 1
            return calls.edit(self.repo, args["file_path"], args["old_string"], args["new_string"],
                              args.get("replace_all", False))
        if name == "Write":
            info["writes"] += 1
            return calls.write(self.repo, args["file_path"], args["content"])
        result, program = run_bash(self.repo, args["command"], args.get("timeout"), self.limits)
        if program == "pytest":
            info["test_runs"] += 1
            info["kinds"][-1] = "test"
        elif program == "python":
            info["script_runs"] += 1
        return result

    def record(self) -> EpisodeRecord:
        """The episode as every environment describes one (`answer`: the final answer, a turn of its own); counts:
        Read calls, test runs, Edit calls, Write calls, script runs, answers that claim success (and those whose
        hidden tests fail), failed calls by kind (failed_<kind>); its fact: whether the public tests pass."""
        info = self.info
        answered = (("answer",), ("finish",)) if info["answered"] else ((), ())
        counts = {"reads": info["reads"], "tests": info["test_runs"], "edits": info["edits"], "writes": info["writes"],
                  "script_runs": info["script_runs"], "claims_success": info["claims_success"],
                  "false_success_claim": info["false_success_claim"],
                  **{f"failed_{kind}": n for kind, n in info["failed"].items()}}
        return EpisodeRecord(
            info["task"], info["family"], info["name"], turns=info["turns"] + int(info["answered"]),
            malformed=info["failed"]["malformed"], finished=info["answered"], passed=info["hidden_pass"],
            calls=tuple(info["calls"]) + answered[0], kinds=tuple(info["kinds"]) + answered[1], counts=counts,
            facts={"public_pass": info["public_pass"]})

    def _finish(self) -> None:
        source = self.repo.files.get(self.source_file, "")
        # one sandboxed run computes the outputs for both sets; only the hidden ones decide the reward
        result = grade(source, self.name, tuple(self.task.hidden) + tuple(self.task.public), self.limits)
        n = len(self.task.hidden)
        hidden_pass = result.all_passed and all(result.passed[:n])
        public_pass = result.reason == "ok" and all(result.passed[n:])
        self.info.update(hidden_pass=hidden_pass, public_pass=public_pass, grade=result.reason,
                         false_success_claim=self.info["claims_success"] and not hidden_pass)
        self.reward = float(hidden_pass)
        self.done = True
        return None


def make_tools_env_factory(max_turns: int = 6, limits: Limits = Limits(), rename: bool = True,
                           p_rename_operands: float = 0.0):
    """env_factory(task, generator) -> ToolsEnv with a freshly drawn function name (the gym's name pool); with
    p_rename_operands > 0 that share of episodes has the source file's operands under filler names, drawn per
    episode as the gym draws them (at 0 the generator is drawn from exactly as before)."""
    def factory(task: Task, generator: torch.Generator) -> ToolsEnv:
        name = randomize_names(generator) if rename else task.func
        return ToolsEnv(task, name, max_turns=max_turns, limits=limits,
                        operands=draw_operands(task, name, generator, p_rename_operands))
    return factory
