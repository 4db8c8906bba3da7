"""Stage select: the checkpoint with the highest validation pass rate (ties to the earlier one), every checkpoint
listed with its task-bootstrap 95% interval; with select.stop_* set, where each stopping rule would have stopped
and what it would have cost (agentrl.eval.stopping; the choice stays the full run's)."""
from agentrl.core.artifacts import COUNT, POSITIVE, RATE, REPORTS, read_json, write_json, write_metrics
from agentrl.core.seeding import stream_seed
from agentrl.eval.selection import checkpoint_rows, choose
from agentrl.eval.stopping import stopping_report
from agentrl.pipeline.stage import run_stage

SECTIONS = ["run", "select"]
READS = {"run": ["seed"]}   # bootstrap seeds; no tensor work, so no thread count
INPUTS = [REPORTS / "train.json", REPORTS / "train_dashboard.json"]
# what the stage reads of them (agentrl.core.artifacts.shape_problem): anything else is one line before any output
TRAIN_SHAPE = {"checkpoints": [{"step": COUNT, "pass_rate": RATE[0], "per_task": {str: {"n": POSITIVE, "c": COUNT}}}]}
DASHBOARD_SHAPE = [{"step": COUNT, "zero_adv_frac": RATE}]


def body(ctx):
    cfg = ctx.params["select"]
    checkpoints = read_json(REPORTS / "train.json", TRAIN_SHAPE)["checkpoints"]
    dashboard = read_json(REPORTS / "train_dashboard.json", DASHBOARD_SHAPE)
    rows = checkpoint_rows(checkpoints, cfg.n_boot, cfg.alpha, ctx.seed)
    chosen = choose(rows)
    out = {"alpha": cfg.alpha, "n_boot": cfg.n_boot, "checkpoints": rows, "chosen": chosen}
    stopping = stopping_report(rows, dashboard, chosen, cfg,
                               {r: stream_seed(ctx.seed, "select-stop", r) for r in ("patience", "zero_adv")})
    if stopping:  # rules off: selection.json is what it always was
        out["stopping"] = stopping
    write_json(REPORTS / "selection.json", out)
    write_json(REPORTS / "plots" / "validation.json", [{k: r[k] for k in ("step", "pass_rate", "ci_lo", "ci_hi")}
                                                         for r in rows])
    write_metrics("select", {k: chosen[k] for k in ("step", "pass_rate", "ci_lo", "ci_hi")})
    ctx.run.log_metrics({"chosen_step": chosen["step"], "chosen_validation": chosen["pass_rate"]})
    for r in rows:
        mark = "  <- chosen" if r["step"] == chosen["step"] else ""
        print(f"select: step {r['step']:3d}  validation {r['pass_rate']:.3f}  "
              f"95% CI [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]{mark}")
    for name, v in stopping.items():
        c = v["validation_cost"]
        print(f"select: rule {name} {v['rule']}: " + (f"stops at step {v['stop_step']} ({v['steps_saved']} steps "
              f"saved), picks step {v['chosen_step']}, validation cost {c['mean']:+.3f} [{c['ci_lo']:+.3f}, "
              f"{c['ci_hi']:+.3f}]" if v["fired"] else "never fires"))


if __name__ == "__main__":
    run_stage("select", SECTIONS, INPUTS, body, numeric=False, only=READS)
