"""Stage base: the RL starting policy, behaviour-cloned from the scripted mixture on the train tasks."""
from agentrl.pipeline import MODELS_DIR, REPORTS, TASKS_DIR, config_dict, load_split, load_tokenizer, run_stage, write_json
from agentrl.policy import ModelConfig, save_policy
from agentrl.starting_policy import make_rl_base


def body(ctx):
    tok, split = load_tokenizer(), load_split()
    mcfg = ModelConfig(vocab_size=len(tok), **config_dict(ctx.params["model"]))
    model, info = make_rl_base(tok, split["train"], ctx.params["base"], mcfg, seed=ctx.seed)
    info["parameters"] = model.num_params()
    save_policy(MODELS_DIR / "base.pt", model, tok.hash, extra={"fingerprint": ctx.fingerprint})
    write_json(REPORTS / "base.json", {"provenance": ctx.provenance, **info})
    ctx.run.log_metrics({k: v for k, v in info.items() if isinstance(v, (int, float))})
    print(f"base: TinyAgent with {info['parameters']:,} parameters, cloned from {info['demos']} demonstrations "
          f"({info['demo_policy_tokens']} policy tokens); loss {info['loss_first']:.3f} -> {info['loss_last']:.3f}")


if __name__ == "__main__":
    run_stage("base", ["model", "base"], [TASKS_DIR / "tokenizer.json", TASKS_DIR / "split.json"], body)
