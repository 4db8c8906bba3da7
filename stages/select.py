"""Stage select: the checkpoint with the highest validation pass rate (ties to the earlier one), every checkpoint
listed with its task-bootstrap 95% interval."""
from agentrl.pipeline import REPORTS, derive_seed, read_json, run_stage, write_json
from agentrl.stats import bootstrap_ci


def body(ctx):
    cfg = ctx.params["select"]
    train = read_json(REPORTS / "train.json")
    rows = []
    for ck in train["checkpoints"]:
        rates = [v["c"] / v["n"] for v in ck["per_task"].values()]
        mean, lo, hi = bootstrap_ci(rates, cfg.n_boot, cfg.alpha, seed=derive_seed(ctx.seed, "select", ck["step"]))
        rows.append({"step": ck["step"], "pass_rate": ck["pass_rate"], "ci_lo": lo, "ci_hi": hi,
                     "per_task": ck["per_task"]})
    best = max(rows, key=lambda r: (r["pass_rate"], -r["step"]))  # ties go to the earlier checkpoint
    chosen = {"step": best["step"], "pass_rate": best["pass_rate"], "ci_lo": best["ci_lo"], "ci_hi": best["ci_hi"],
              "checkpoint": f"data/train/checkpoints/step_{best['step']:04d}.pt"}
    write_json(REPORTS / "selection.json", {"provenance": ctx.provenance, "alpha": cfg.alpha, "n_boot": cfg.n_boot,
                                            "checkpoints": rows, "chosen": chosen})
    ctx.run.log_metrics({"chosen_step": best["step"], "chosen_validation": best["pass_rate"]})
    for r in rows:
        mark = "  <- chosen" if r is best else ""
        print(f"select: step {r['step']:3d}  validation {r['pass_rate']:.3f}  "
              f"95% CI [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]{mark}")


if __name__ == "__main__":
    run_stage("select", ["select"], [REPORTS / "train.json"], body)
