"""Stage length_start: the length-bias pair's starting policy, cloned with the RL base's recipe and seed from a
mixture that reads, tests every repair and, after a failed test, keeps calling tools (length.p_*)."""
from agentrl.backends.registry import save_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import SPLIT, TOKENIZER, policy_path
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.faults.length import length_start_config
from agentrl.model.policy import ModelConfig
from agentrl.pipeline.stage import run_stage
from agentrl.starting.tinyagent import make_rl_base

SECTIONS = ["model", "base", "length"]
USES = (TINYAGENT,)   # the registered entries it uses (imported: its code deps hold their modules)
READS = {"length": ["p_read", "p_test", "p_give_up", "p_hardcode", "p_persist"]}
INPUTS = [TOKENIZER, SPLIT]


def body(ctx):
    tok, split = load_tokenizer(), load_split()
    mcfg = ModelConfig(vocab_size=len(tok), **ctx.params["model"].to_dict())
    cfg = length_start_config(ctx.params["base"], ctx.params["length"])
    model, info = make_rl_base(tok, split["train"], cfg, mcfg, seed=ctx.seed)
    save_checkpoint(model, policy_path("length_start"), tok.hash)
    ctx.run.log_metrics({k: v for k, v in info.items() if isinstance(v, (int, float))})
    print(f"length_start: cloned from {info['demos']} demonstrations; loss {info['loss_first']:.3f} -> "
          f"{info['loss_last']:.3f}")


if __name__ == "__main__":
    run_stage("length_start", SECTIONS, INPUTS, body, only=READS)
