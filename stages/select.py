"""Stage select: the checkpoint with the highest validation pass rate (ties to the earlier one), every checkpoint
listed with its task-bootstrap 95% interval."""
from agentrl.artifacts import REPORTS, read_json, write_json, write_metrics
from agentrl.eval.selection import checkpoint_rows, choose
from agentrl.stage import run_stage

SECTIONS = ["run", "select"]
READS = {"run": ["seed"]}   # bootstrap seeds; no tensor work, so no thread count
INPUTS = [REPORTS / "train.json"]


def body(ctx):
    cfg = ctx.params["select"]
    rows = checkpoint_rows(read_json(REPORTS / "train.json")["checkpoints"], cfg.n_boot, cfg.alpha, ctx.seed)
    chosen = choose(rows)
    write_json(REPORTS / "selection.json", {"alpha": cfg.alpha, "n_boot": cfg.n_boot, "checkpoints": rows,
                                            "chosen": chosen})
    write_json(REPORTS / "plots" / "validation.json", [{k: r[k] for k in ("step", "pass_rate", "ci_lo", "ci_hi")}
                                                         for r in rows])
    write_metrics("select", {k: chosen[k] for k in ("step", "pass_rate", "ci_lo", "ci_hi")})
    ctx.run.log_metrics({"chosen_step": chosen["step"], "chosen_validation": chosen["pass_rate"]})
    for r in rows:
        mark = "  <- chosen" if r["step"] == chosen["step"] else ""
        print(f"select: step {r['step']:3d}  validation {r['pass_rate']:.3f}  "
              f"95% CI [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]{mark}")


if __name__ == "__main__":
    run_stage("select", SECTIONS, INPUTS, body, numeric=False, only=READS)
