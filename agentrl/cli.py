"""python -m agentrl {envcheck, check, bench, audit, replay}."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _threads(n: int) -> None:
    import torch
    torch.set_num_threads(n)


def cmd_envcheck(args) -> int:
    from agentrl.gym import environment_check
    from agentrl.tasks import make_tasks
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


def quick_base(tok, seed: int = 0):
    """A small, fast behaviour-cloned base for checks when data/models/base.pt is not available."""
    from agentrl.config import BaseConfig
    from agentrl.starting_policy import make_rl_base
    from agentrl.tasks import make_tasks
    cfg = BaseConfig(demos_per_task=20, steps=80, teach_steps=40, p_rename_operands=0.75, p_give_up=0.3)
    return make_rl_base(tok, make_tasks("train"), cfg, seed=seed)[0]


def check_model(path: str | None, tok):
    """The RL base from `path`, data/models/base.pt, or (neither usable) a quick freshly cloned base."""
    from agentrl.policy import CheckpointError, load_policy
    for candidate in ([path] if path else ["data/models/base.pt"]):
        if candidate and Path(candidate).exists():
            try:
                return load_policy(candidate, tok.hash)[0], candidate
            except CheckpointError as exc:
                if path:
                    raise
                print(f"check: {exc}; using a quick base instead", file=sys.stderr)
    return quick_base(tok), "quick base (cloned now)"


def cmd_check(args) -> int:
    _threads(args.threads)
    import torch
    from agentrl.diagnostics import CHECKS, EXPECTED_FAILURES, failed_checks, sanity_checks
    from agentrl.rollout import sample_step
    from agentrl.tasks import make_tasks
    from agentrl.tokenizer import build_tokenizer
    from agentrl.trainer import RLConfig, env_factory_for
    tok = build_tokenizer(make_tasks("all"))
    model, source = check_model(args.model, tok)
    cfg = RLConfig(kl_coef=args.kl_coef, seed=args.seed)
    batch, _ = sample_step(model, env_factory_for(cfg), make_tasks("train"), tok, cfg,
                           torch.Generator().manual_seed(args.seed))
    res = sanity_checks(model, batch, tok, cfg, args.bug)
    print(f"check: nine invariants on one {len(batch)}-episode batch from {source}"
          + (f", injected fault {args.bug}" if args.bug else ""))
    for i, name in enumerate(CHECKS):
        value, ok = res[name]
        print(f"  {i + 1}. {name:20s} {float(value):12.4g}  {'pass' if ok else 'FAIL'}")
    failed = failed_checks(res)
    if args.bug:
        print(f"check: expected failures {sorted(EXPECTED_FAILURES[args.bug])}, got {sorted(failed)}")
    print("check: " + ("all nine invariants hold" if not failed else f"FAILED {sorted(failed)}"))
    return 0 if not failed else 1


def cmd_bench(args) -> int:
    from agentrl.bench import run_bench
    return run_bench(args)


def cmd_audit(args) -> int:
    from agentrl.tracking import AuditError, ProvenanceError, audit, format_audit
    try:
        result = audit(args.spec)
    except (AuditError, ProvenanceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_audit(result))
    return 0 if result["status"] == "current" else 1


def cmd_replay(args) -> int:
    from agentrl.diagnostics import replay_bundle, same_stats
    target = args.bundle
    if target.isdigit():
        target = str(Path(args.bundle_dir) / f"step_{int(target):04d}.pt")
    if not Path(target).is_file():
        print(f"error: replay bundle {target} not found", file=sys.stderr)
        return 2
    recorded, replayed = replay_bundle(target)
    same = same_stats(recorded, replayed)
    print(f"replay {target}:")
    for k in sorted(recorded):
        print(f"  {k:16s} recorded {recorded[k]!r:>24}  replayed {replayed.get(k)!r:>24}")
    print("replay: " + ("identical statistics" if same else "statistics DIFFER"))
    return 0 if same else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentrl", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("envcheck", help="weak expert vs random policy reward distributions")
    e.add_argument("--episodes", type=int, default=200)
    e.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("check", help="the nine trainer invariants; exit 1 on any failure (git bisect run)")
    c.add_argument("--model", help="policy checkpoint (default: data/models/base.pt, else a quick base)")
    c.add_argument("--bug", help="inject a fault to see it caught")
    c.add_argument("--kl-coef", type=float, default=0.1)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=int, default=2)
    b = sub.add_parser("bench", help="median time of one training step at 1 and 2 threads")
    b.add_argument("--steps", type=int, default=7, help="timed steps per thread count (after 2 warm-up steps)")
    b.add_argument("--threads", default="1,2")
    b.add_argument("--model", help="policy checkpoint (default: data/models/base.pt, else a quick base)")
    a = sub.add_parser("audit", help="which params, inputs, code and threads produced a reported number")
    a.add_argument("spec", help="reports/<file>.json:<dotted.path>, e.g. reports/test.json:chosen.pass_at_1")
    r = sub.add_parser("replay", help="re-run a saved training step from its replay bundle")
    r.add_argument("bundle", help="bundle file, or a step number (looked up in --bundle-dir)")
    r.add_argument("--bundle-dir", default="data/train/bundles")
    args = p.parse_args(argv)
    return {"envcheck": cmd_envcheck, "check": cmd_check, "bench": cmd_bench, "audit": cmd_audit,
            "replay": cmd_replay}[args.cmd](args)
