"""Stage faults: the fault catalogue (SPEC §8 item 9). A healthy reference and every failure of the debugging
chapter, all with the same seed and from the RL base, except the length pair, which starts from a base cloned
with the same recipe from a mixture that reads, tests every repair and, after a failed test, keeps trying
(faults.length_p_*); per failure its healthy twin, the metric that exposes it, a signature check, and a 2x2
dashboard panel. The logic lives in agentrl.catalogue; this script wires it up."""
import sys
import time

from agentrl.catalogue import (build_catalogue, figure_specs, length_seed_sweep, length_start_config,
                               length_sweep_note, length_sweep_summary, mlflow_metrics, render_markdown, report_json,
                               signature_checks, signature_table, verdict, with_length_across_seeds)
from agentrl.figures import fault_panel
from agentrl.pipeline import (FIGURES, MODELS_DIR, REPORTS, TASKS_DIR, config_dict, derive_seed, load_split,
                              load_tokenizer, run_stage, write_json)
from agentrl.policy import ModelConfig, load_for
from agentrl.starting_policy import make_rl_base
from agentrl.trainer import RLConfig

FIG_DIR = FIGURES / "faults"


def body(ctx):
    fcfg = ctx.params["faults"]
    tok, split = load_tokenizer(), load_split()
    base, _ = load_for(MODELS_DIR / "base.pt", tok, ctx.params["model"])
    cfg = RLConfig(**ctx.params["rl"].to_dict() | {"seed": ctx.seed})
    eval_seed = derive_seed(ctx.seed, "faults", "heldout")  # one evaluation stream for every run
    t0 = time.time()
    # the length pair's start: the base recipe (same seed) with a mixture that reads and, after failing, persists
    mcfg = ModelConfig(vocab_size=len(tok), **config_dict(ctx.params["model"]))
    length_start, start_info = make_rl_base(tok, split["train"], length_start_config(ctx.params["base"], fcfg), mcfg,
                                            seed=ctx.seed)
    print(f"faults: length-pair start cloned in {time.time() - t0:.0f} s (loss {start_info['loss_first']:.3f} -> "
          f"{start_info['loss_last']:.3f})", file=sys.stderr, flush=True)
    runs = build_catalogue(base, tok, split["train"], split["heldout"], cfg, fcfg, eval_seed,
                           length_start=length_start)
    checks = signature_checks(runs)
    sweep_seeds = [ctx.seed + i for i in range(1, fcfg.length_extra_seeds + 1)]
    sweep = length_seed_sweep(length_start, tok, split["train"], cfg, fcfg, sweep_seeds)
    checks = with_length_across_seeds(checks, sweep)
    notes = {"length_bias": length_sweep_note(sweep, ctx.seed, checks.get("length_bias"))}
    figures = {}
    for spec in figure_specs(runs):
        name = spec.pop("name")
        fault_panel(FIG_DIR / f"{name}.png", name, **spec)
        figures[name] = f"figures/faults/{name}.png"   # relative to reports/
    rows, summary = mlflow_metrics(runs, checks)
    ctx.run.log_history(rows)
    sweep_summary = length_sweep_summary(sweep, checks.get("length_bias"))
    summary.update({f"length_sweep.{k}": v for k, v in sweep_summary.items()})
    ctx.run.log_metrics(summary)
    write_json(REPORTS / "faults.json", report_json(runs, checks, fcfg, cfg, ctx.provenance, split["heldout"],
                                                    eval_seed, figures, sweep))
    (REPORTS / "faults.md").write_text(render_markdown(runs, checks, fcfg, ctx.provenance, split["heldout"], figures,
                                                       notes, sweep_summary))
    for line in signature_table(runs, checks):
        print(line)
    print(f"faults: {len(runs)} runs in {time.time() - t0:.0f} s; signatures: "
          + ", ".join(f"{n} {verdict(r)}" for n, r in checks.items())
          + (f"; length pair across {sweep_summary['seeds']} seeds: signature holds at {sweep_summary['holds']}"
             if sweep else ""), file=sys.stderr)


if __name__ == "__main__":
    run_stage("faults", ["model", "base", "rl", "faults"],
              [TASKS_DIR / "tokenizer.json", TASKS_DIR / "split.json", MODELS_DIR / "base.pt"], body)
