"""Stage tasks: the task catalogue, the train/validation/test split and the tokenizer vocabulary."""
from agentrl.core.artifacts import SPLIT, TASKS_DIR, TOKENIZER, write_json
from agentrl.env.gym.tokenizer import build_tokenizer
from agentrl.env.tasks import make_tasks
from agentrl.pipeline.stage import run_stage

SECTIONS = ["tasks"]


def body(ctx):
    families = ctx.params["tasks"].families
    tasks = [t for t in make_tasks("all") if t.family in families]
    tok = build_tokenizer(tasks)
    write_json(TASKS_DIR / "tasks.json", {"tasks": [t.to_dict() for t in tasks]})
    write_json(SPLIT, {s: [t.name for t in tasks if t.split == s] for s in ("train", "validation", "test")})
    write_json(TOKENIZER, {"vocab": tok.vocab, "hash": tok.hash})
    ctx.run.log_metrics({"tasks": len(tasks), "vocab_size": len(tok)})
    print(f"tasks: {len(tasks)} tasks, vocabulary {len(tok)} tokens (hash {tok.hash})")


if __name__ == "__main__":
    run_stage("tasks", SECTIONS, [], body, numeric=False)
