"""Stage preflight: the nine invariants on the first batch, the full fault matrix, and the environment check.

A gate: exits non-zero (so nothing downstream runs) if the clean trainer fails any invariant or any injected
fault escapes the invariant expected to catch it."""
from dataclasses import replace

from agentrl.backends.registry import load_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import (
    DATA,
    FIGURES,
    REPORTS,
    SPLIT,
    TOKENIZER,
    StageError,
    policy_path,
    write_json,
    write_metrics,
)
from agentrl.core.seeding import generator, stream_seed
from agentrl.env.gym.callers import environment_check
from agentrl.env.gym.spec import GYM
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.faults.preflight import fault_matrix
from agentrl.pipeline.stage import run_stage
from agentrl.report.figures import check_matrix
from agentrl.rl.rollout import sample_step

SECTIONS = ["model", "rl", "preflight"]
USES = (TINYAGENT, GYM)   # the registered entries it uses (imported: its code deps hold their modules)
INPUTS = [TOKENIZER, SPLIT, policy_path("base")]
GATE = DATA / "preflight" / "gate.json"


def body(ctx):
    pcfg = ctx.params["preflight"]
    tok, split = load_tokenizer(), load_split()
    base, _ = load_checkpoint(TINYAGENT.name, policy_path("base"), tok, ctx.params["model"])
    cfg = replace(ctx.params["rl"], kl_coef=pcfg.kl_coef)
    episodes = GYM.make(cfg)
    batch, _ = sample_step(base, episodes, split["train"], tok, cfg, generator(ctx.seed, "preflight"))
    out = fault_matrix(base, batch, tok, cfg, pcfg.bugs)
    out["environment"] = env = environment_check(split["train"], episodes=200, seed=stream_seed(ctx.seed, "envcheck"))
    write_json(REPORTS / "preflight.json", out)
    write_metrics("preflight", {"gate_passed": out["gate"] == "passed", "matches_expected": out["matches_expected"],
                                "sampler_trainer_gap": out["clean"]["sampler_trainer_gap"]["value"]})
    rows = ["None"] + list(pcfg.bugs)
    check_matrix(FIGURES / "preflight_matrix.png", ["clean"] + list(pcfg.bugs), out["checks"],
                 [[out["matrix"][b][c]["passed"] for c in out["checks"]] for b in rows],
                 [set(out["expected"][b]) for b in rows])
    ctx.run.log_metrics({f"clean.{k}": float(v["value"]) for k, v in out["clean"].items()} |
                        {"expert_reward": env["expert"]["mean_reward"], "random_reward": env["random"]["mean_reward"],
                         "gate": float(out["gate"] == "passed")})
    ctx.run.log_artifact(REPORTS / "preflight.json")
    ctx.run.log_artifact(FIGURES / "preflight_matrix.png")
    print("preflight: clean: " + ", ".join(f"{k} {float(v['value']):.3g} ({v['relation']} {v['threshold']:g}"
                                           + (f", {v['margin']:.3g}x)" if v["margin"] else ")")
                                           for k, v in out["clean"].items()))
    for b in rows:
        print(f"preflight: {b:15s} fails {out['failed'][b] or '-'} (expected {out['expected'][b] or '-'})")
    print(f"preflight: environment: expert {env['expert']['mean_reward']:.3f}, "
          f"random {env['random']['mean_reward']:.3f}")
    if out["gate"] != "passed":
        clean = out["failed"]["None"]
        errors = {k: v["error"] for k, v in out["clean"].items() if "error" in v}
        raise StageError("preflight gate failed: " + (f"clean trainer fails {clean}; " if clean else "")
                         + (f"errors: {errors}; " if errors else "")
                         + (f"escaped: {out['escaped']}" if out["escaped"] else ""))
    # the gate file downstream stages depend on: the same content whenever the gate passes on the same inputs
    write_json(GATE, {"gate": "passed", "tokenizer": tok.hash, "clean_checks": out["checks"], "bugs": list(pcfg.bugs)})


if __name__ == "__main__":
    run_stage("preflight", SECTIONS, INPUTS, body)
