"""Stage preflight: the nine invariants on the first batch, the full fault matrix, and the environment check.

A gate: exits non-zero (so nothing downstream runs) if the clean trainer fails any invariant or any injected
fault escapes the invariant expected to catch it."""
import torch

from agentrl.diagnostics import BUGS, CHECKS, EXPECTED_FAILURES, THRESHOLDS, failed_checks, sanity_checks
from agentrl.figures import check_matrix
from agentrl.gym import environment_check
from agentrl.policy import load_for
from agentrl.pipeline import (DATA, FIGURES, MODELS_DIR, REPORTS, TASKS_DIR, StageError, derive_seed,
                              load_split, load_tokenizer, run_stage, write_json)
from agentrl.rollout import sample_step
from agentrl.trainer import RLConfig, env_factory_for


def body(ctx):
    pcfg = ctx.params["preflight"]
    tok, split = load_tokenizer(), load_split()
    base, _ = load_for(MODELS_DIR / "base.pt", tok, ctx.params["model"])
    cfg = RLConfig(**ctx.params["rl"].to_dict() | {"seed": ctx.seed, "kl_coef": pcfg.kl_coef})
    g = torch.Generator().manual_seed(derive_seed(ctx.seed, "preflight"))
    batch, _ = sample_step(base, env_factory_for(cfg), split["train"], tok, cfg, g)
    rows = [None] + list(pcfg.bugs)
    matrix = {str(bug): sanity_checks(base, batch, tok, cfg, bug) for bug in rows}
    failed = {name: failed_checks(res) for name, res in matrix.items()}
    expected = {str(bug): EXPECTED_FAILURES[bug] for bug in rows}
    escaped = {b: sorted(expected[b] - failed[b]) for b in failed if expected[b] - failed[b]}
    extra = {b: sorted(failed[b] - expected[b]) for b in failed if failed[b] - expected[b]}
    env = environment_check(split["train"], episodes=200, seed=derive_seed(ctx.seed, "envcheck"))
    gate = not failed["None"] and not escaped
    out = {"provenance": ctx.provenance, "checks": list(CHECKS), "kl_coef": pcfg.kl_coef,
           "thresholds": {c: {"relation": r, "value": v} for c, (r, v) in THRESHOLDS.items()},
           "batch_episodes": len(batch), "clean": {k: {"value": v, "passed": p} for k, (v, p) in matrix["None"].items()},
           "matrix": {b: {k: {"value": v, "passed": p} for k, (v, p) in res.items()} for b, res in matrix.items()},
           "failed": {b: sorted(f) for b, f in failed.items()}, "expected": {b: sorted(e) for b, e in expected.items()},
           "matches_expected": all(failed[b] == expected[b] for b in failed), "escaped": escaped, "unexpected": extra,
           "bugs": {b: BUGS[b] for b in pcfg.bugs}, "environment": env, "gate": "passed" if gate else "failed"}
    write_json(REPORTS / "preflight.json", out)
    check_matrix(FIGURES / "preflight_matrix.png", ["clean"] + list(pcfg.bugs), list(CHECKS),
                 [[matrix[str(b)][c][1] for c in CHECKS] for b in rows], [expected[str(b)] for b in rows])
    ctx.run.log_metrics({f"clean.{k}": float(v) for k, (v, _) in matrix["None"].items()} |
                        {"expert_reward": env["expert"]["mean_reward"], "random_reward": env["random"]["mean_reward"],
                         "gate": float(gate)})
    print("preflight: clean margins: " + ", ".join(f"{k} {float(v):.3g}" for k, (v, _) in matrix["None"].items()))
    for b in rows:
        print(f"preflight: {str(b):15s} fails {sorted(failed[str(b)]) or '-'} (expected {sorted(expected[str(b)]) or '-'})")
    print(f"preflight: environment: expert {env['expert']['mean_reward']:.3f}, random {env['random']['mean_reward']:.3f}")
    if not gate:
        raise StageError("preflight gate failed: " + ("clean trainer fails " + str(sorted(failed["None"])) + "; "
                                                      if failed["None"] else "") + (f"escaped: {escaped}" if escaped else ""))
    # the gate file downstream stages depend on: same content whenever the gate passes on the same inputs
    write_json(DATA / "preflight" / "gate.json", {"gate": "passed", "tokenizer": tok.hash,
                                                  "clean_checks": list(CHECKS), "bugs": list(pcfg.bugs)})


if __name__ == "__main__":
    run_stage("preflight", ["model", "rl", "preflight"], [TASKS_DIR / "tokenizer.json", TASKS_DIR / "split.json",
                                                           MODELS_DIR / "base.pt"], body)
