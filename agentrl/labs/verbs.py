"""The labs' verbs of `python -m agentrl`: labcheck (a backend proven on a device), labcells (cold starts and
updates side by side), opprobe (the op the policy would choose after reading each source), labtemps (a lab's
checkpoints over a grid of sampling temperatures) and labbaselines (more cloning and rejection sampling, matched to
GRPO's steps). Their arguments and
commands; nothing here imports torch when the module loads (the entry point pins the CPU numerics first), and each
command is given the entry point's `set_threads`."""
from __future__ import annotations


def add_lab_verbs(sub, int_at_least):
    """The verbs' parsers on the entry point's subparsers; returns labcheck's (it also takes --numerics)."""
    lc = sub.add_parser("labcheck", help="a Hugging Face backend on a device: one cold-start step, the nine "
                                         "invariants and two GRPO steps, then a verdict (a few minutes)")
    lc.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    lc.add_argument("--model", help="a Qwen3 or Llama model directory (default: a small random-init Qwen3)")
    lc.add_argument("--threads", type=int_at_least(1), default=2)
    lc.add_argument("--json", action="store_true", help="the result as one JSON line")
    cells = sub.add_parser("labcells", help="a lab's cold starts and GRPO updates, cell by cell (docs/labs.md)")
    add_recipe_flags(cells, int_at_least)
    cells.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="a LabRun key or rl.<key> changed in every cell")
    cells.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                       help="one axis of the grid (every combination of the axes is a cell)")
    cells.add_argument("--steps", type=int_at_least(1), default=3, help="GRPO steps per cell")
    cells.add_argument("--threads", type=int_at_least(1), default=2)
    cells.add_argument("--table", action="store_true", help="print the lab's cells so far and stop")
    op = sub.add_parser("opprobe", help="which repair a menu lab's policy would choose after reading each source, "
                                        "teacher-forced: p(oracle op), op entropy, information (docs/labs.md)")
    add_recipe_flags(op, int_at_least)
    op.add_argument("--checkpoint", action="append", default=[], choices=["cold_start", "final"],
                    help="probe the lab's saved checkpoint data/labs/<lab>/seed<N>/<checkpoint> (repeatable)")
    op.add_argument("--clone-curve", type=int_at_least(1), metavar="STEPS",
                    help="rerun the lab's cold start to STEPS cloning steps, probing every --every steps")
    op.add_argument("--every", type=int_at_least(1), default=32, help="cloning steps between probes")
    op.add_argument("--threads", type=int_at_least(1), default=2)
    op.add_argument("--table", action="store_true", help="print the lab's probes so far and stop")
    lt = sub.add_parser("labtemps", help="a lab's cold start and GRPO checkpoint evaluated over a grid of sampling "
                                         "temperatures: GRPO's gain over the tempered cold start (docs/labs.md)")
    add_recipe_flags(lt, int_at_least)
    lt.add_argument("--temperatures", default="0.3,0.5,0.7,1.0", help="comma-separated, each in (0, 2]")
    lt.add_argument("--threads", type=int_at_least(1), default=2)
    lt.add_argument("--table", action="store_true", help="print the lab's grid so far and stop")
    bl = sub.add_parser("labbaselines", help="compute-matched baselines from a lab's cold start: more cloning and "
                                             "rejection sampling, as many Adam steps as GRPO took (docs/labs.md)")
    add_recipe_flags(bl, int_at_least)
    bl.add_argument("--threads", type=int_at_least(1), default=2)
    bl.add_argument("--table", action="store_true", help="print the lab's baselines so far and stop")
    bl.add_argument("--arms", type=lambda v: [a.strip() for a in v.split(",") if a.strip()],
                    help="arms to run, comma-separated (default: all; agentrl/labs/baselines.py lists them); the "
                         "others' results already kept for the same budget stay")
    return lc


def add_recipe_flags(parser, int_at_least) -> None:
    """--lab NAME or --config FILE, and --seed: which recipe at which seed (agentrl.labs.instance)."""
    parser.add_argument("--lab", help="an entry of lab.configs")
    parser.add_argument("--config", help="an explored recipe's reports/labs/explored/<recipe>/config.yaml")
    parser.add_argument("--seed", type=int_at_least(0), help="the lab's seed (default 0)")


def cmd_labcheck(args, set_threads) -> int:
    """A backend proven on a device: cold start, the nine invariants and two GRPO steps (agentrl.labs.check)."""
    import json

    from agentrl.labs.check import labcheck
    set_threads(args.threads)
    out = labcheck(args.device, args.model, log=(lambda *_: None) if args.json else print)
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        memory = f"peak memory {out['peak_memory_mib']:.0f} MiB resident"
        if out["peak_device_memory_mib"] is not None:
            memory += f", {out['peak_device_memory_mib']:.0f} MiB on {out['device']}"
        print(f"labcheck: {'PASS' if out['passed'] else 'FAIL'} on {out['device']} in {out['seconds']:.0f} s "
              f"({memory})")
    return 0 if out["passed"] else 1


def cmd_labcells(args, set_threads) -> int:
    """Cold starts and GRPO updates side by side at a fraction of a lab's cost (agentrl.labs.cells)."""
    from agentrl.labs.cells import labcells, table
    from agentrl.labs.instance import load_named
    params, inst = load_named(args.lab, args.config, args.seed)
    if not args.table:
        set_threads(args.threads)
        labcells(params, inst, args.set, args.grid, args.steps)
    print(table(inst))
    return 0


def cmd_opprobe(args, set_threads) -> int:
    """Which op the policy would choose after reading each source, teacher-forced (agentrl.labs.probe)."""
    from agentrl.core.config import ConfigError
    from agentrl.labs.instance import load_named
    from agentrl.labs.probe import clone_curve, probe_checkpoints, table
    params, inst = load_named(args.lab, args.config, args.seed)
    if not args.table:
        if not args.checkpoint and not args.clone_curve:
            raise ConfigError("opprobe: name a --checkpoint, --clone-curve or --table")
        if args.clone_curve and args.every > args.clone_curve:
            raise ConfigError(f"opprobe: --every ({args.every}) must be at most --clone-curve ({args.clone_curve})")
        set_threads(args.threads)
        if args.clone_curve:
            clone_curve(params, inst, args.every, args.clone_curve)
        if args.checkpoint:
            probe_checkpoints(params, inst, args.checkpoint)
    print(table(inst))
    return 0


def cmd_labtemps(args, set_threads) -> int:
    """The temperature grid of a lab's kept checkpoints (agentrl.labs.temperatures)."""
    from agentrl.core.config import ConfigError
    from agentrl.labs.instance import load_named
    from agentrl.labs.report import interval
    from agentrl.labs.temperatures import evaluate_grid, load, summary, table
    try:
        temps = sorted({float(t) for t in args.temperatures.split(",")})
    except ValueError:
        raise ConfigError(f"labtemps --temperatures: expected numbers like 0.3,0.5,0.7,1.0, got "
                          f"{args.temperatures[:80]!r}") from None
    if not temps or not all(0 < t <= 2 for t in temps) or 1.0 not in temps:
        raise ConfigError(f"labtemps --temperatures: each in (0, 2], 1.0 among them (GRPO's own); got "
                          f"{args.temperatures[:80]!r}")
    params, inst = load_named(args.lab, args.config, args.seed)
    if not args.table:
        set_threads(args.threads)
        evaluate_grid(params, inst, temps)
    grid = load(inst)
    if grid is None:
        raise ConfigError(f"labtemps --table: no grid for {inst.name} seed {inst.seed} yet (run labtemps)")
    print("\n".join(table(summary(grid, inst.seed), interval)))
    return 0


def cmd_labbaselines(args, set_threads) -> int:
    """Compute-matched baselines beside GRPO from a lab's kept cold start (agentrl.labs.baselines)."""
    import json

    from agentrl.core.config import ConfigError
    from agentrl.labs.baselines import load, report_of, summary, table, train_arms
    from agentrl.labs.instance import load_named
    from agentrl.labs.report import interval
    params, inst = load_named(args.lab, args.config, args.seed)
    if not args.table:
        from agentrl.labs.baselines import check_arms
        arms = check_arms(args.arms) if args.arms else None   # a wrong name: one line, before anything loads
        set_threads(args.threads)
        train_arms(params, inst, arms=arms)
    arms = load(inst)
    if arms is None:
        raise ConfigError(f"labbaselines --table: no baselines for {inst.name} seed {inst.seed} yet (run "
                          f"labbaselines)")
    print("\n".join(table(summary(arms, json.loads(report_of(inst).read_text())), interval)))
    return 0


LAB_VERBS = {"labcheck": cmd_labcheck, "labcells": cmd_labcells, "opprobe": cmd_opprobe, "labtemps": cmd_labtemps,
             "labbaselines": cmd_labbaselines}


def in_lab_process(cmd, args, set_threads) -> int:
    """A lab verb's command, its process keeping freed memory as the lab stage's does (agentrl.labs.allocator), so
    that its timings are the lab's."""
    from agentrl.labs.allocator import keep_freed_memory
    keep_freed_memory()
    return cmd(args, set_threads)
