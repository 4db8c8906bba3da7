"""python -m agentrl check|envcheck|bench|labcheck|labcells|opprobe|labtemps|labbaselines|audit|replay|study|research|
sweep|compare-reports|deps|params.

Each verb is an entry point: it validates its arguments (one line on stderr and exit code 2 for a bad one), sets
torch's thread count once, then works, inside the error boundary (agentrl.core.boundary: exit 1 with a log file for an
unexpected error, 130 on Ctrl-C, 143 on SIGTERM).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path

from agentrl.backends.registry import BACKENDS
from agentrl.core.artifacts import policy_path
from agentrl.core.boundary import check_threads, guard
from agentrl.core.lab_config import DTYPES, PREFIX_KV
from agentrl.labs.verbs import LAB_VERBS, add_lab_verbs, in_lab_process
from agentrl.model.kernels.registry import KERNELS


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2) instead of usage + message."""

    def error(self, message):
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def _int_at_least(lo: int):
    def parse(text: str) -> int:
        if not re.fullmatch(r"-?[0-9]{1,20}", text):   # int() would also take " 7\t", "1_0" and "٣"
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo} (digits 0-9), got {ascii(text)[:80]}")
        value = int(text)
        if value < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {value}")
        return value
    return parse


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def _seed(text: str) -> int:
    from agentrl.core.config import SEED_MAX
    value = _int_at_least(0)(text)
    if value > SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected a seed in [0, {SEED_MAX}] (64 bits), got {value}")
    return value


def _list_of(parse, example: str):
    """A comma-separated list, each part read by parse; an empty list is refused with an example."""
    def parse_list(text: str) -> list:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"expected a list like {example}, got {text!r}")
        return [parse(p) for p in parts]
    return parse_list


def _one_of(allowed: tuple):
    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"expected {' or '.join(allowed)}, got {text!r}")
        return text
    return parse


_thread_list = _list_of(_int_at_least(1), "1,2")
_episode_list = _list_of(_int_at_least(8), "16,64,256")
_seed_list = _list_of(_seed, "0,1,2")
_rows_list = _list_of(_int_at_least(1), "16,32,64,128")
_dtype_list, _prefix_kv_list = _list_of(_one_of(DTYPES), "fp32,bf16"), _list_of(_one_of(PREFIX_KV), "repeat,once")


def _fault_name(text: str) -> str:
    from agentrl.core.config import FAULT_NAMES
    if text not in FAULT_NAMES:
        raise argparse.ArgumentTypeError(f"unknown fault {text!r}; allowed: {', '.join(FAULT_NAMES)}")
    return text


DEFAULT_MODEL = str(policy_path("base"))
MODEL_HINT = " (or pass --model PATH or --quick-base)"


def _model_path(args) -> str | None:
    """The checkpoint --model names (or the default base), checked to exist before torch is imported, so a wrong
    path costs a fraction of a second; None with --quick-base."""
    if args.quick_base:
        return None
    path = args.model or DEFAULT_MODEL
    if not Path(path).is_file():
        raise ValueError(f"checkpoint {path}: file not found" + ("" if args.model else MODEL_HINT))
    return path


LAB_RECIPE_VERBS = ("labcells", "opprobe", "labtemps", "labbaselines")   # verbs that run one lab recipe


def numerics_mode(args) -> str:
    """--numerics, else params.yaml's run.numerics when the file says, else portable (the param's default)."""
    from agentrl.core.config import ParamsError, read_params_file
    from agentrl.core.numerics import check_mode
    if getattr(args, "numerics", None):
        return args.numerics
    if args.cmd == "params":   # the verb that reads the file: its problem is its answer, not a numerics question
        return "portable"
    try:
        params = read_params_file("params.yaml") if Path("params.yaml").exists() else {}
        if args.cmd in LAB_RECIPE_VERBS:   # the lab's own numerics, as its stage runs it
            from agentrl.core.lab_config import stage_mode
            return check_mode(stage_mode(params, "lab", args.lab or (args.config and f"file:{args.config}")))
        run = params.get("run") or {}
    except ParamsError as exc:
        raise ParamsError(f"{exc} (the params file decides this verb's numerics; or pass --numerics)") from None
    return check_mode(run.get("numerics", "portable") if isinstance(run, dict) else "portable")


def set_threads(n: int) -> None:
    """Threads and the CPU numerics main() pinned, set once for the verb (agentrl.core.numerics.enter)."""
    from agentrl.core.numerics import enter
    check_threads(n)
    enter(n, os.environ.get("AGENTRL_NUMERICS", "portable"))


def fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def load_model(args, tok):
    """The policy under test: --model PATH (must exist), data/models/base.pt by default, or --quick-base (a small
    base cloned now, deterministically). Never a silent substitute."""
    from agentrl.backends.registry import load_checkpoint
    if args.quick_base:
        from agentrl.core.config import BaseConfig
        from agentrl.env.tasks import make_tasks
        from agentrl.starting.tinyagent import make_rl_base
        cfg = BaseConfig(demos_per_task=20, steps=80, teach_steps=40)
        return make_rl_base(tok, make_tasks("train"), cfg, seed=0)[0], "a quick base (cloned now)"
    path = _model_path(args)
    return load_checkpoint("tinyagent", path, tok)[0], path


def cmd_envcheck(args) -> int:
    from agentrl.env.gym.callers import environment_check
    from agentrl.env.tasks import make_tasks
    res = environment_check(make_tasks("train"), episodes=args.episodes, seed=args.seed)
    print(f"environment check: {args.episodes} episodes per policy on the train tasks, renamed functions")
    for label, r in res.items():
        fam = "  ".join(f"{f} {v:.2f}" for f, v in r["per_family"].items())
        print(f"  {label:6s} mean reward {r['mean_reward']:.3f}   rewards 0: {r['reward_counts']['0']:4d}  "
              f"1: {r['reward_counts']['1']:4d}   turns {r['mean_turns']:.2f}   invalid {r['invalid_per_episode']:.2f}")
        print(f"         per family: {fam}")
    ok = res["expert"]["mean_reward"] >= 0.95 and res["random"]["mean_reward"] <= 0.2
    print("environment check: " + ("OK (expert >= 0.95, random <= 0.2)" if ok else "FAILED"))
    return 0 if ok else 1


def _rl_override(text: str) -> tuple[str, object]:
    import yaml
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (an rl key), got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        raise argparse.ArgumentTypeError(f"{key}: not a YAML value: {value!r}") from None


def check_config(args) -> tuple:
    """(RLConfig, threads) of a check: params.yaml's rl section with preflight.kl_coef and run.seed/threads, as the
    preflight stage reads them (library defaults where there is no params.yaml, e.g. a bare package copy), then
    --seed, --threads, --kl-coef and --rl KEY=VALUE on top."""
    from agentrl.core.config import RLConfig, load_params
    from agentrl.rl import variants  # noqa: F401 (the names the rl knobs take, registered)
    overrides = dict(args.rl or [])
    unknown = [k for k in overrides if k not in RLConfig.__dataclass_fields__ or k in ("seed", "kl_coef")]
    if unknown:
        raise ValueError(f"check: --rl {unknown[0]}: not an rl key here (--seed and --kl-coef set those)")
    if Path(args.params).is_file() or args.params != "params.yaml":
        p = load_params(["run", "rl", "preflight"], args.params)
        values, seed, threads, kl = p["rl"].to_dict(), p["run"].seed, p["run"].threads, p["preflight"].kl_coef
    else:
        values, seed, threads, kl = {}, 0, 2, 0.1
    seed = seed if args.seed is None else args.seed
    kl = kl if args.kl_coef is None else args.kl_coef
    cfg = RLConfig(**{**values, **overrides, "seed": seed, "kl_coef": kl})
    return cfg, (threads if args.threads is None else args.threads)


def cmd_check(args) -> int:
    from agentrl.core.config import UserError
    try:
        cfg, threads = check_config(args)
        _model_path(args)
    except (UserError, ValueError) as exc:
        return fail(str(exc))
    overrides = dict(args.rl or [])
    set_threads(threads)
    import json

    import agentrl
    from agentrl.core.seeding import generator
    from agentrl.env.gym.spec import GYM
    from agentrl.env.gym.tokenizer import build_tokenizer
    from agentrl.env.tasks import make_tasks
    from agentrl.faults.registry import EXPECTED_FAILURES, seams_for
    from agentrl.rl.invariants import CHECKS, THRESHOLDS, failed_checks, margin, sanity_checks
    from agentrl.rl.rollout import sample_step
    tok = build_tokenizer(make_tasks("all"))
    seams = seams_for(args.bug)
    try:
        model, source = load_model(args, tok)
    except UserError as exc:
        return fail(str(exc) + ("" if args.model or args.quick_base else MODEL_HINT))
    batch, _ = sample_step(model, GYM.make(cfg), make_tasks("train"), tok, cfg, generator(cfg.seed))
    res = sanity_checks(model, batch, tok, cfg, seams)
    print(f"check: nine invariants on one {len(batch)}-episode batch from {source}"
          + (f", injected fault {args.bug}" if args.bug else "")
          + (", " + ", ".join(f"{k}={v}" for k, v in overrides.items()) if overrides else ""))
    for i, name in enumerate(CHECKS):
        value, ok = res[name]
        relation, threshold = THRESHOLDS[name]
        clears = margin(name, value)
        print(f"  {i + 1}. {name:20s} {float(value):12.4g}  {'pass' if ok else 'FAIL'}  ({relation} {threshold:g}"
              + (f", {clears:.3g}x" if clears else "") + ")" + (f"  {res.errors[name]}" if name in res.errors else ""))
    failed = failed_checks(res)
    if args.bug:
        print(f"check: expected failures {sorted(EXPECTED_FAILURES[args.bug])}, got {sorted(failed)}")
    print("check: " + ("all nine invariants hold" if not failed else f"FAILED {sorted(failed)}"))
    if args.json:
        values = {n: float(res[n][0]) for n in CHECKS}
        print(json.dumps({"package": str(Path(agentrl.__file__).parent), "checks": list(CHECKS), "values": values,
                          "failed": sorted(failed), "errors": res.errors,
                          "margins": {n: margin(n, v) for n, v in values.items()}}))
    return 0 if not failed else 1


class Verb:
    """What a backend's bench needs from the CLI: threads and numerics set once, the checkpoint --model names
    (or --quick-base), one-line failures."""
    set_threads = staticmethod(lambda n: set_threads(n))
    model_path = staticmethod(lambda args: _model_path(args))
    load_model = staticmethod(lambda args, tok: load_model(args, tok))
    fail = staticmethod(lambda msg: fail(msg))
    model_hint = MODEL_HINT


def cmd_bench(args) -> int:
    """The backend's own bench (BackendSpec.bench), its GRPO config validated first: the knobs name registered
    variants, so the package that registers them is imported here, not left to whatever the bench imports first."""
    from agentrl.bench import BENCHES
    from agentrl.core.config import RLConfig, UserError
    if args.backend == "tinyagent" and not args.quick_base:
        try:
            _model_path(args)   # a missing checkpoint: one line before torch is imported
        except (UserError, ValueError) as exc:
            return fail(str(exc))
    from agentrl.rl import variants  # noqa: F401 (the names the rl knobs take, registered)
    RLConfig()
    return BENCHES.get(args.backend)(args, Verb)


def cmd_audit(args) -> int:
    from agentrl.tracking.audit import main
    return main(args.spec, args.json)


def cmd_replay(args) -> int:
    target = args.bundle
    if target.isdigit():
        target = str(Path(args.bundle_dir) / f"step_{int(target):04d}.pt")
    if not Path(target).is_file():
        return fail(f"replay bundle {target} not found")
    from agentrl.faults.registry import seams_for
    from agentrl.rl.guards import replay_bundle, same_stats
    recorded, replayed = replay_bundle(target, seams_for)
    same = same_stats(recorded, replayed)
    print(f"replay {target}:")
    for k in sorted(recorded):
        print(f"  {k:16s} recorded {recorded[k]!r:>24}  replayed {replayed.get(k)!r:>24}")
    print("replay: " + ("identical statistics" if same else "statistics DIFFER"))
    return 0 if same else 1


def cmd_study(args) -> int:
    from agentrl.studies import labs, length
    return {**length.STUDIES, "labs": labs.comparison}[args.name]()


def cmd_research(args) -> int:
    from agentrl.core.config import load_params
    from agentrl.rl import variants  # noqa: F401 (the studies validate the rl section: its variants, registered)
    from agentrl.studies.research import main
    try:
        set_threads(load_params(["run"])["run"].threads)
    except ValueError as exc:
        return fail(str(exc))
    return main(args.name, args.seeds, args.steps)


def cmd_sweep(args) -> int:
    from agentrl.pipeline.sweep.driver import main
    return main(args.stage, args.address, args.max_parallel)


def cmd_params(args) -> int:
    """params.yaml validated as the stages read it, every section, within the project's bounds: `make repro` runs
    it before DVC parses the file with its own loader (docs/dvc.md)."""
    from agentrl.core.config import SECTIONS, load_params
    from agentrl.rl import variants  # noqa: F401 (the names the rl knobs take, registered)
    load_params(list(SECTIONS), args.params)
    print(f"params: {args.params}: every section valid")
    return 0


def cmd_deps(args) -> int:
    from agentrl.tracking.closure import rewrite_dvc_yaml
    changed = rewrite_dvc_yaml(".")
    print("deps: dvc.yaml " + ("rewritten from the stages' import closures" if changed else "already current"))
    return 0


def cmd_compare_reports(args) -> int:
    if args.trees:
        if len(args.trees) != 2:
            return fail(f"compare-reports: give two report trees A B (e.g. reports /tmp/rebuild/reports), got "
                        f"{len(args.trees)}")
        from agentrl.report.verdict import main as compare_trees
        return compare_trees(args.trees[0], args.trees[1], args.json)
    from agentrl.report.numbers import main
    return main(args.snapshot, args.reports, args.moved)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m agentrl", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=OneLineParser)
    e = sub.add_parser("envcheck", help="weak expert vs random policy reward distributions")
    e.add_argument("--episodes", type=_int_at_least(1), default=200)
    e.add_argument("--seed", type=_seed, default=0)
    c = sub.add_parser("check", help="the nine trainer invariants; exit 1 on any failure (git bisect run)")
    c.add_argument("--model", help=f"policy checkpoint (default: {DEFAULT_MODEL})")
    c.add_argument("--quick-base", action="store_true", help="clone a small base now instead of loading one")
    c.add_argument("--bug", type=_fault_name, help="inject a registered fault to see it caught")
    c.add_argument("--params", default="params.yaml", help="params file: rl, run.seed/threads, preflight.kl_coef "
                                                           "(the flags below override it)")
    c.add_argument("--kl-coef", type=_nonneg_float, help="default: preflight.kl_coef")
    c.add_argument("--seed", type=_seed, help="default: run.seed")
    c.add_argument("--threads", type=_int_at_least(1), help="default: run.threads")
    c.add_argument("--rl", action="append", type=_rl_override, metavar="KEY=VALUE",
                   help="an RLConfig field for this check, e.g. loss_mode=seq_mean_token_sum_norm (repeatable)")
    c.add_argument("--json", action="store_true", help="also print the values as one JSON line")
    b = sub.add_parser("bench", help="step time at 1 and 2 threads, and the sampler against a full-recompute one")
    b.add_argument("--steps", type=_int_at_least(1), default=7, help="timed steps per thread count (after 2 warm-up)")
    b.add_argument("--threads", type=_thread_list, default=[1, 2])
    b.add_argument("--model", help=f"policy checkpoint (default: {DEFAULT_MODEL})")
    b.add_argument("--quick-base", action="store_true", help="clone a small base now instead of loading one")
    b.add_argument("--profile", action="store_true", help="instead: cProfile of --steps training steps and one "
                                                          "evaluation pass at the largest --threads "
                                                          "(docs/performance.md)")
    b.add_argument("--numerics-compare", type=_int_at_least(1), metavar="ROUNDS",
                   help="instead: step time under portable and native numerics, each mode in its own process, "
                        "alternating for ROUNDS rounds (docs/numerics.md)")
    b.add_argument("--json", action="store_true", help="print the step times as one JSON line")
    b.add_argument("--kernels", choices=list(KERNELS.names()), default="fixed",
                   help="tinyagent: the kernel set timed (torch: PyTorch's own operators, the baseline)")
    b.add_argument("--batch", type=_episode_list, metavar="EPISODES",
                   help="instead: sampling and update cost at these episodes per step (e.g. 16,64,256,1024), "
                        "their slope, GFLOP/s against a same-run GEMM and tokens per second per core")
    b.add_argument("--backend", choices=list(BACKENDS.names()), default="tinyagent",
                   help="hf: the lab backend's sampler against plain generate, the update's GFLOP/s against a "
                        "same-run GEMM, and its peak memory with the LM head on policy positions against full logits "
                        "(--model: a Qwen3 or Llama directory, e.g. data/models/smollm2-135m-instruct)")
    b.add_argument("--rows", type=_rows_list, default=[16, 32, 64, 128], help="hf: rows decoded together, a list")
    b.add_argument("--dtype", type=_dtype_list, default=["fp32"], help="hf: fp32, bf16 or both, each in turn "
                   "(bf16 is refused on a CPU without amx_bf16 or avx512_bf16, and under portable numerics)")
    b.add_argument("--new-tokens", type=_int_at_least(1), default=24, help="hf: new tokens per prompt")
    b.add_argument("--prefix-kv", type=_prefix_kv_list, default=["repeat"], help="hf: the sampler's shared prefix "
                   "copied into every row (repeat) or kept once (once); the decode scan runs each in turn")
    b.add_argument("--decode-only", action="store_true", help="hf: the decode scan and its floors alone")
    b.add_argument("--memory-rows", type=_int_at_least(1), default=8, help="hf: rows of the measured update")
    b.add_argument("--clone-rows", type=_int_at_least(1), default=4, help="hf: conversations of the measured cloning "
                   "step (the committed recipe's clone_batch)")
    b.add_argument("--isa-caps", action="store_true", help="hf, instead: a GEMM of the model's shapes in fp32 and "
                   "bf16 under each cap on the CPU libraries' instruction sets (AVX512-BF16, AVX-512, AVX2, "
                   "portable), one child process each (docs/performance.md)")
    lc = add_lab_verbs(sub, _int_at_least)
    a = sub.add_parser("audit", help="which params, inputs, code and threads produced a reported number")
    a.add_argument("spec", help="reports/<file>.json:<dotted.path>, e.g. reports/test.json:chosen.pass_at_1")
    a.add_argument("--json", action="store_true", help="machine-readable answer")
    r = sub.add_parser("replay", help="re-run a saved training step from its replay bundle")
    r.add_argument("bundle", help="bundle file, or a step number (looked up in --bundle-dir)")
    r.add_argument("--bundle-dir", default="data/train/bundles")
    s = sub.add_parser("study", help="summarize a study run outside the default pipeline")
    s.add_argument("name", choices=["length-bias", "labs"])
    q = sub.add_parser("research", help="the research studies of docs/research.md (not in the default pipeline)")
    q.add_argument("name", choices=["entropy-collapse", "rollout-efficiency", "stopping", "all"])
    q.add_argument("--seeds", type=_seed_list, help="seeds per arm, e.g. 0,1,2 (default: the study's)")
    q.add_argument("--steps", type=_int_at_least(1), help="steps per run (default: the study's)")
    w = sub.add_parser("sweep", help="run a matrix stage's missing or stale instances as Ray tasks, recorded in "
                                     "dvc.lock as by dvc repro (docs/sweep.md)")
    w.add_argument("stage", help="a stage with a matrix or foreach, e.g. ablate")
    w.add_argument("--address", help="join a running Ray cluster (default: $RAY_ADDRESS, else a local Ray started "
                                     "and stopped by the command)")
    w.add_argument("--max-parallel", type=_int_at_least(1), help="at most this many instances at once")
    for verb in (e, c, b, r, q, lc):
        verb.add_argument("--numerics", choices=["portable", "native"],
                          help="CPU numerics for this verb (default: params.yaml run.numerics, else portable)")
    sub.add_parser("deps", help="rewrite each stage's code deps in dvc.yaml from its import closure")
    pv = sub.add_parser("params", help="validate params.yaml as the stages read it (make repro runs it before DVC "
                                       "parses the file)")
    pv.add_argument("--params", default="params.yaml")
    m = sub.add_parser("compare-reports", help="two report trees A B: identical, or what differs and whether any "
                                               "conclusion changes; without A B: reports/*.json against a snapshot")
    m.add_argument("trees", nargs="*", metavar="TREE", help="two report directories, e.g. reports /tmp/x/reports")
    m.add_argument("--json", action="store_true", help="with A B: the comparison as JSON")
    m.add_argument("--snapshot", default="tests/fixtures/reports_numbers.json")
    m.add_argument("--reports", default="reports")
    m.add_argument("--moved", default="tests/fixtures/reports_moved.json")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    verb = next((a for a in argv if not a.startswith("-")), "")
    return guard(f"agentrl {verb}".strip(), _main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    from agentrl.core.numerics import pin
    pin(numerics_mode(args))   # before any verb imports torch: the kernels are chosen when it loads
    verbs = {"envcheck": cmd_envcheck, "check": cmd_check, "bench": cmd_bench, "audit": cmd_audit,
             "replay": cmd_replay, "study": cmd_study, "compare-reports": cmd_compare_reports, "deps": cmd_deps,
             "params": cmd_params, "research": cmd_research, "sweep": cmd_sweep,
             **{verb: (lambda a, cmd=cmd: in_lab_process(cmd, a, set_threads)) for verb, cmd in LAB_VERBS.items()}}
    return verbs[args.cmd](args)
