"""Stage lab@<name>: a real-model lab (docs/labs.md) on the Hugging Face backend. Outside the default pipeline
(lab.runs is empty by default): `dvc exp run -S 'lab.runs=[menu]'`, or `python -m stages.lab --lab menu` directly.
Writes reports/labs/<name>.{json,md}; the model and checkpoints stay under data/labs/<name>/ (not committed), and a
lab killed part-way goes on from its last finished phase or GRPO step when run again (agentrl.labs.progress); one its
gates stop keeps its report and provenance record, then exits with one line naming the failed checks. A lab
whose entry sets `numerics` runs under it (agentrl.core.numerics.stage_mode), the rest under run.numerics."""

from agentrl.backends.hf import ENTRY as HF
from agentrl.core.artifacts import DATA, REPORTS, StageError, write_json, write_text
from agentrl.core.config import LAB_CONFIGS, UserError, read_params_file
from agentrl.env.coding.spec import CODING
from agentrl.env.gym.spec import GYM
from agentrl.pipeline.instances import StageArguments, matrix_instance
from agentrl.pipeline.stage import entry, run_stage
from agentrl.rl import variants

SECTIONS = ["rl", "lab"]
READS = {"lab": ["device", "eval_batch", "configs"]}   # an instance reads its own entry of lab.configs
USES = (HF, GYM, CODING, variants)   # the registered entries it uses (imported: its code deps hold their modules)
# (variants: the rl section and each lab's rl overrides name registered variants, checked before the lab runs)


def lab_instance(name: str | None, params_path: str = "params.yaml") -> str:
    lab = read_params_file(params_path).get("lab") or {}
    runs, configs = lab.get("runs"), lab.get("configs", LAB_CONFIGS)
    if not isinstance(runs, list) or not isinstance(configs, dict):
        raise UserError(f"{params_path}: lab.runs must be a list and lab.configs a mapping")
    if name is not None and name not in configs:
        raise UserError(f"--lab: unknown value {name[:80]!r}; allowed: {', '.join(map(str, configs))}")
    return matrix_instance("lab", {"lab": runs}, {"lab": name}, params_path)["lab"]


def main(name: str | None = None, past_gates: bool = False):
    name = lab_instance(name)
    stopped = []   # why the gates stopped the lab: the stage exits with it once its report and provenance are kept

    def body(ctx):
        from agentrl.labs.allocator import keep_freed_memory
        from agentrl.labs.progress import clear_progress
        from agentrl.labs.recipe import run_lab
        keep_freed_memory()
        from agentrl.labs.report import lab_report
        from agentrl.labs.timing import SandboxShare
        out = DATA / "labs" / name
        share = SandboxShare()
        record = run_lab(name, ctx.params, out, DATA / "models" / f"lab-{name}", hooks=[share], clock=share.clock,
                         past_gates=past_gates, resume_key=ctx.run.fingerprint)
        record["threads"] = ctx.threads
        if record["config"]["model"]:   # the stage's model output names the pretrained directory it loaded
            write_json(DATA / "models" / f"lab-{name}" / "model.json",
                       {"model_dir": record["model_dir"], "model": record["model"]})
        if record["config"]["environment"] == "coding":
            record["sandbox"] = share.summary()
        numbers, markdown = lab_report(record)
        write_json(REPORTS / "labs" / f"{name}.json", numbers)
        write_text(REPORTS / "labs" / f"{name}.md", markdown)
        for step, row in enumerate(record["history"], 1):   # the GRPO dashboard, one row per step
            ctx.run.log_metrics({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=step)
        held = numbers["held_out"]
        ctx.run.log_metrics({"heldout_before": held["before"]["mean"], "wall_s": record["wall_s"],
                             "cpu_s": record["cpu_s"], "peak_memory_mib": record["peak_memory_mib"],
                             **({"heldout_after": held["after"]["mean"], "heldout_gain": held["gain"]["mean"]}
                                if "gain" in held else {})})
        if record["stopped"] and not record["stopped"]["went_on"]:   # its phases stay kept for --past-gates
            stopped.extend(record["stopped"]["reasons"])
            ctx.run.set_tags({"stopped_before_grpo": "; ".join(stopped)[:1000]})
            return
        clear_progress(out)   # the report is written: nothing left to resume
        print(f"lab {name}: held-out pass {held['before']['mean']:.3f} -> {held['after']['mean']:.3f} "
              f"(gain {held['gain']['mean']:+.3f} [{held['gain']['lo']:+.3f}, {held['gain']['hi']:+.3f}]) "
              f"in {record['wall_s']:.0f} s")

    spec = (read_params_file("params.yaml").get("lab") or {}).get("configs", LAB_CONFIGS).get(name, {})
    run_stage(f"lab@{name}", SECTIONS, [], body, only={"lab": ["device", "eval_batch", f"configs.{name}"]},
              numerics=spec.get("numerics") if isinstance(spec, dict) else None)
    if stopped:   # after the stage run closed: the report of a stopped lab is audited like any other
        raise StageError(f"lab {name}: stopped before GRPO: {'; '.join(stopped)} (the report reports/labs/{name}.md "
                         "says so; --past-gates goes on)")


if __name__ == "__main__":
    p = StageArguments(prog="lab")
    p.add_argument("--lab")
    p.add_argument("--past-gates", action="store_true", help="go on to GRPO when the preflight or the signal check "
                   "fails (the report says so in its first lines)")
    args = p.parse_args()
    entry("lab", main, args.lab, args.past_gates)
