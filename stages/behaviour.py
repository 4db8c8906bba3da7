"""Stage behaviour: what the agent learned -- the starting policy and the chosen checkpoint re-evaluated on every
held-out task from one stream: behaviour statistics, top tool sequences, first edit op per task, and one decoded
failure transcript per bug family. The report renders reports/behaviour.json; it runs no model itself."""
from agentrl.backends.registry import load_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import (
    CHECKPOINT_DIR,
    COUNT,
    REPORTS,
    SPLIT,
    TOKENIZER,
    checkpoint_path,
    policy_path,
    read_json,
    write_json,
    write_metrics,
)
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.eval.behaviour import what_was_learned
from agentrl.pipeline.stage import run_stage

SECTIONS = ["tasks", "model", "rl", "behaviour"]
USES = (TINYAGENT,)   # the registered entries it uses (imported: its code deps hold their modules)
READS = {"rl": ["max_turns", "max_call_tokens", "rename", "temperature"]}
INPUTS = [TOKENIZER, SPLIT, policy_path("base"), CHECKPOINT_DIR, REPORTS / "selection.json"]
SELECTION_SHAPE = {"chosen": {"step": COUNT, "checkpoint": str}}   # what the stage reads of it


def body(ctx):
    bcfg = ctx.params["behaviour"]
    tok, split = load_tokenizer(), load_split()
    chosen = read_json(REPORTS / "selection.json", SELECTION_SHAPE)["chosen"]
    start, _ = load_checkpoint(TINYAGENT.name, policy_path("base"), tok, ctx.params["model"])
    model, _ = load_checkpoint(TINYAGENT.name, checkpoint_path(chosen["step"]), tok, ctx.params["model"])
    out = what_was_learned(start, model, split["heldout"], tok, ctx.params["rl"], bcfg.episodes_per_task,
                           bcfg.transcripts_per_family, ctx.seed, list(ctx.params["tasks"].families),
                           chosen["checkpoint"])
    write_json(REPORTS / "behaviour.json", out)
    write_metrics("behaviour", {f"{who}_pass_rate": out[who]["behavior"]["pass_rate"] for who in ("start", "chosen")})
    ctx.run.log_metrics({f"{who}.{k}": v for who in ("start", "chosen") for k, v in out[who]["behavior"].items()})
    ctx.run.log_artifact(REPORTS / "behaviour.json")
    print(f"behaviour: hidden-test pass start {out['start']['behavior']['pass_rate']:.3f} -> chosen "
          f"{out['chosen']['behavior']['pass_rate']:.3f}; families still failing: "
          f"{', '.join(out['families_with_failures']) or 'none'}")


if __name__ == "__main__":
    run_stage("behaviour", SECTIONS, INPUTS, body, only=READS)
