"""Stage lab@<lab>-<seed>: a real-model lab (docs/labs.md) on the Hugging Face backend: a recipe at a seed
(agentrl.labs.instance). Outside the default pipeline (lab.runs is empty by default): `python -m stages.lab --lab
smollm2 --seed 3`, an explored recipe with `--config reports/labs/explored/<recipe>/config.yaml`, or under DVC
`dvc exp run -S 'lab.runs=[smollm2]' -S 'lab.seeds=[0,1,2]'`.

Writes reports/labs/<lab>/seed<N>.{json,md} (an explored recipe's beside its config); the model and checkpoints stay
under data/labs/ (not committed), and a lab killed part-way goes on from its last finished phase or GRPO step when
run again (agentrl.labs.progress); one its gates stop keeps its report and provenance record, then exits with one line
naming the failed checks. A lab whose config sets `numerics` runs under it (agentrl.core.lab_config.stage_mode), the
rest under run.numerics."""

from agentrl.backends.hf import ENTRY as HF
from agentrl.core.artifacts import StageError, write_json, write_text
from agentrl.core.config import load_params
from agentrl.env.coding.spec import CODING
from agentrl.env.gym.spec import GYM
from agentrl.labs.instance import named
from agentrl.pipeline.instances import StageArguments, matrix_instance, seed_arg
from agentrl.pipeline.stage import entry, run_stage
from agentrl.rl import variants

SECTIONS = ["rl", "lab"]
# an instance reads the settings every lab shares and its own config; lab.configs is declared whole in dvc.yaml, as an
# entry's `base` reads another entry; runs and seeds only name the instances
READS = {"lab": ["device", "eval_batch", "configs"]}
USES = (HF, GYM, CODING, variants)   # the registered entries it uses (imported: its code deps hold their modules)
# (variants: the rl section and each lab's rl overrides name registered variants, checked before the lab runs)


def lab_instance(name: str | None, seed: int | None, config: str | None, params_path: str = "params.yaml"):
    """The recipe and seed this process runs: its flags, or under DVC the lab.runs x lab.seeds item $DVC_STAGE
    names."""
    lab = load_params(["lab"], params_path)["lab"]
    if name is None and config is None and seed is None:
        item = matrix_instance("lab", {"lab": lab.runs, "seed": lab.seeds}, {"lab": None, "seed": None}, params_path)
        name, seed = item["lab"], item["seed"]
    return named(lab, name, config, seed)


def refuse_before_the_run(inst) -> None:
    """What this machine cannot run, refused in one line before any MLflow run exists: a device torch lacks, bf16
    where the CPU or the numerics pin cannot compute it."""
    from agentrl.core.config import lab_run
    from agentrl.labs.precision import check_dtype
    from agentrl.labs.recipe import check_device
    device = load_params(["lab"])["lab"].device
    check_device(device)
    check_dtype(lab_run(inst.name, inst.spec).dtype, device, f"LabConfig.configs.{inst.name}.dtype")


def main(name: str | None = None, seed: int | None = None, config: str | None = None, past_gates: bool = False):
    inst = lab_instance(name, seed, config)
    refuse_before_the_run(inst)
    stopped = []   # why the gates stopped the lab: the stage exits with it once its report and provenance are kept

    def body(ctx):
        from agentrl.core.config import lab_run
        from agentrl.labs import controls
        from agentrl.labs.allocator import keep_freed_memory
        from agentrl.labs.progress import clear_progress
        from agentrl.labs.recipe import run_lab
        keep_freed_memory()
        from agentrl.labs.phase_cache import CACHE_DIR, PhaseCache, stage_context
        from agentrl.labs.report import lab_report
        from agentrl.labs.timing import SandboxShare
        from agentrl.tracking.provenance import project_root
        share = SandboxShare()
        record = run_lab(inst.name, lab_run(inst.name, inst.spec), inst.seed, ctx.params, inst.work_dir,
                         inst.model_dir, hooks=[share], clock=share.clock, past_gates=past_gates,
                         resume_key=ctx.run.fingerprint,
                         cache=PhaseCache(project_root() / CACHE_DIR, stage_context(ctx.run.record),
                                          f"{inst.stage} (MLflow run {ctx.run.run_id})"),
                         after_grpo=controls.after_grpo)
        record["threads"] = ctx.threads
        if record["config"]["model"]:   # the stage's model output names the pretrained directory it loaded
            write_json(inst.model_dir / "model.json", {"model_dir": record["model_dir"], "model": record["model"]})
        if record["config"]["environment"] == "coding":
            record["sandbox"] = share.summary()
        numbers, markdown = lab_report(record)
        write_json(inst.report.with_suffix(".json"), numbers)
        write_text(inst.report.with_suffix(".md"), markdown)
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
        clear_progress(inst.work_dir)   # the report is written: nothing left to resume
        print(f"lab {inst.name} seed {inst.seed}: held-out pass {held['before']['mean']:.3f} -> "
              f"{held['after']['mean']:.3f} (gain {held['gain']['mean']:+.3f} [{held['gain']['lo']:+.3f}, "
              f"{held['gain']['hi']:+.3f}]) in {record['wall_s']:.0f} s; {inst.report}.md")

    run_stage(inst.stage, SECTIONS, [], body, only={"run": ["threads", "numerics"], "lab": []},
              extra=lambda params: {"lab": named(params["lab"], None if inst.explored else inst.name,
                                                 inst.config_file, inst.seed).logged(params["lab"])},
              numerics=inst.spec.get("numerics"))
    if stopped:   # after the stage run closed: the report of a stopped lab is audited like any other
        raise StageError(f"lab {inst.name} seed {inst.seed}: stopped before GRPO: {'; '.join(stopped)} (the report "
                         f"{inst.report}.md says so; --past-gates goes on)")


if __name__ == "__main__":
    p = StageArguments(prog="lab")
    p.add_argument("--lab", help="an entry of lab.configs (params.yaml)")
    p.add_argument("--config", help="an explored recipe: reports/labs/explored/<recipe>/config.yaml")
    p.add_argument("--seed", type=seed_arg, help="the lab's seed: every random stream derives from it (default 0)")
    p.add_argument("--past-gates", action="store_true", help="go on to GRPO when the preflight or the signal check "
                   "fails (the report says so in its first lines)")
    args = p.parse_args()
    entry("lab", main, args.lab, args.seed, args.config, args.past_gates)
