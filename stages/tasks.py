"""Stage tasks: the task catalogue, the train/validation/test split and the tokenizer vocabulary."""
from agentrl.pipeline import TASKS_DIR, run_stage, write_json
from agentrl.tasks import make_tasks
from agentrl.tokenizer import build_tokenizer


def body(ctx):
    families = ctx.params["tasks"].families
    tasks = [t for t in make_tasks("all") if t.family in families]
    tok = build_tokenizer(tasks)
    stamp = {"fingerprint": ctx.fingerprint}
    write_json(TASKS_DIR / "tasks.json", {**stamp, "tasks": [t.to_dict() for t in tasks]})
    write_json(TASKS_DIR / "split.json", {**stamp, **{s: [t.name for t in tasks if t.split == s]
                                                     for s in ("train", "validation", "test")}})
    write_json(TASKS_DIR / "tokenizer.json", {**stamp, "vocab": tok.vocab, "hash": tok.hash})
    ctx.run.log_metrics({"tasks": len(tasks), "vocab_size": len(tok)})
    print(f"tasks: {len(tasks)} tasks, vocabulary {len(tok)} tokens (hash {tok.hash})")


if __name__ == "__main__":
    run_stage("tasks", ["tasks"], [], body, numeric=False)
