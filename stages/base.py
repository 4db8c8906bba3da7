"""Stage base: the RL starting policy, behaviour-cloned from the scripted mixture on the train tasks."""
from agentrl.backends.registry import save_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import REPORTS, SPLIT, TOKENIZER, policy_path, write_json, write_metrics
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.model.policy import ModelConfig
from agentrl.pipeline.stage import run_stage
from agentrl.starting.tinyagent import make_rl_base

SECTIONS = ["model", "base"]
USES = (TINYAGENT,)   # the registered entries it uses (imported: its code deps hold their modules)
INPUTS = [TOKENIZER, SPLIT]


def body(ctx):
    tok, split = load_tokenizer(), load_split()
    mcfg = ModelConfig(vocab_size=len(tok), **ctx.params["model"].to_dict())
    model, info = make_rl_base(tok, split["train"], ctx.params["base"], mcfg, seed=ctx.seed)
    info["parameters"] = model.num_params()
    save_checkpoint(model, policy_path("base"), tok.hash)
    write_json(REPORTS / "base.json", info)
    write_metrics("base", {"parameters": info["parameters"], "loss_last": info["loss_last"]})
    ctx.run.log_metrics({k: v for k, v in info.items() if isinstance(v, (int, float))})
    print(f"base: TinyAgent with {info['parameters']:,} parameters, cloned from {info['demos']} demonstrations "
          f"({info['demo_policy_tokens']} policy tokens); loss {info['loss_first']:.3f} -> {info['loss_last']:.3f}")


if __name__ == "__main__":
    run_stage("base", SECTIONS, INPUTS, body)
