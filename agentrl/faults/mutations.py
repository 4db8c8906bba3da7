"""Source mutations: realistic one-line bugs in the real trainer source (not registry faults), each applied to a
temporary copy of the package and checked by `python -m agentrl check` run in a subprocess with the copy first on
sys.path. Preflight must fail at least one named invariant for each; docs/preflight.md has the table.

    python -m agentrl.faults.mutations [--only NAME ...] [--model data/models/base.pt] [--json PATH]
    python -m agentrl.faults.mutations --bisect advantage_sign    (git bisect run names the mutated commit)

A mutation may name the run config its code path needs (`rl`: a loss mode, std scaling): preflight checks the
configuration a run uses, so a bug in a mode the run does not use is caught when a run uses it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str                 # file inside the package
    old: str                  # source text, exactly once in the file (context lines included)
    new: str                  # the same text with one line changed
    what: str
    expect: frozenset         # invariants (1-based) it fails on the seed-0 batch
    rl: dict = field(default_factory=dict)   # RLConfig overrides the mutated code path needs


MUTATIONS = (
    Mutation("advantage_sign", "rl/objectives.py", "        a = r - baseline(r)", "        a = baseline(r) - r",
             "group advantage computed as mean minus reward", frozenset({8})),
    Mutation("mask_off_by_one", "rl/rollout.py",
             'self.action_mask = [int(o == OWNER["policy"]) for o in self.owner[1:]]',
             'self.action_mask = [int(o == OWNER["policy"]) for o in self.owner[:-1]]',
             "action mask read off ids instead of ids[1:]", frozenset({1, 2})),
    Mutation("gather_off_by_one", "model/policy.py",
             "        logp = selected_log_probs(logits, ids[:, 1:].reshape(-1)[at])",
             "        logp = selected_log_probs(logits, ids[:, :-1].reshape(-1)[at])",
             "trainer log-probs gathered at the input token instead of the next one", frozenset({2, 3, 6, 8})),
    Mutation("clip_bounds_swapped", "rl/objectives.py", "ratio.clamp(1 - low, 1 + high)",
             "ratio.clamp(1 + high, 1 - low)", "clip bounds swapped", frozenset({6})),
    Mutation("ratio_inverted", "rl/objectives.py", "    return exp(logp - old_logp)",
             "    return exp(old_logp - logp)", "importance ratio inverted (old / new)", frozenset({6, 8})),
    Mutation("detach_wrong_side", "rl/objectives.py", "    return exp(logp - old_logp)",
             "    return exp(logp.detach() - old_logp)",
             "new log-probs detached instead of the old ones (no policy gradient)", frozenset({6, 8, 9})),
    Mutation("old_logp_not_detached", "rl/trainer.py",
             "@torch.no_grad()\ndef real_log_probs(",
             "@torch.enable_grad()\ndef real_log_probs(",
             "old log-probs computed with gradient tracking (not detached)", frozenset({6, 7, 8, 9})),
    Mutation("old_logp_recomputed", "rl/trainer.py", "    return old_logp\n",
             '    return forward_logp(model, mb["ids"])[0].detach()\n',
             "old log-probs recomputed from the current weights for every minibatch", frozenset({7})),
    Mutation("kl_sign", "rl/trainer.py", "        loss = loss + cfg.kl_coef * aggregate_loss(",
             "        loss = loss - cfg.kl_coef * aggregate_loss(", "KL penalty added with the wrong sign",
             frozenset({6})),
    Mutation("kl_k3_reversed", "rl/objectives.py", "    return exp(-log_ratio) - 1 + log_ratio",
             "    return exp(log_ratio) - 1 - log_ratio",
             "k3 estimator of the reverse KL, KL(ref, pi) instead of KL(pi, ref)", frozenset({6})),
    Mutation("entropy_sign", "rl/objectives.py", "    return -coef * aggregate_loss(entropy, mask, mode, norm_len)",
             "    return coef * aggregate_loss(entropy, mask, mode, norm_len)",
             "entropy bonus with the wrong sign in the formula", frozenset({6})),
    Mutation("token_mean_over_padding", "rl/objectives.py", "    return masked.sum() / mask.sum().clamp(min=1)",
             "    return masked.sum() / mask.numel()", "token_mean divided by every position, padding included",
             frozenset({5, 6})),
    Mutation("seq_mean_wrong_axis", "rl/objectives.py",
             "    return (masked.sum(1) / mask.sum(1).clamp(min=1)).mean()",
             "    return (masked.sum(0) / mask.sum(0).clamp(min=1)).mean()",
             "seq_mean_token_mean averaged over positions first (the wrong axis)", frozenset({5, 6}),
             {"loss_mode": "seq_mean_token_mean"}),
    Mutation("microbatch_weight_by_rows", "rl/trainer.py",
             "        return float(mask.sum() / total_mask.sum().clamp(min=1))",
             "        return mask.shape[0] / total_mask.shape[0]",
             "token_mean microbatches weighted by rows instead of tokens", frozenset({6})),
    Mutation("std_over_batch", "rl/objectives.py", "    return r.std(unbiased=True) if r.numel() > 1",
             "    return rewards.std(unbiased=True) if r.numel() > 1",
             "advantage scaled by the batch's reward std, not the group's",
             frozenset({4}), {"adv_std_scale": True}),
    Mutation("reference_is_policy", "rl/trainer.py", "        p.requires_grad_(False)\n    return ref",
             "        p.requires_grad_(False)\n    return model",
             "the KL reference is the policy being trained (updated with it)", frozenset({9})),
)
BY_NAME = {m.name: m for m in MUTATIONS}


def apply(mutation: Mutation, root: Path) -> None:
    """Edit the copy of the package under `root` (root/agentrl/...); the source text must occur exactly once."""
    path = root / "agentrl" / mutation.path
    src = path.read_text()
    if src.count(mutation.old) != 1:
        raise ValueError(f"mutation {mutation.name}: {mutation.path} holds its source text "
                         f"{src.count(mutation.old)} times, expected once")
    path.write_text(src.replace(mutation.old, mutation.new))


def copy_package(root: Path) -> None:
    shutil.copytree(PACKAGE, root / "agentrl", ignore=shutil.ignore_patterns("__pycache__"))


def check_command(model: str, rl: dict, threads: int = 1) -> list[str]:
    cmd = [sys.executable, "-m", "agentrl", "check", "--model", str(Path(model).resolve()), "--threads", str(threads),
           "--json"]
    for key, value in rl.items():
        cmd += ["--rl", f"{key}={json.dumps(value)}"]
    return cmd


def run_check(root: Path, model: str, rl: dict, threads: int = 1, timeout: float = 1200) -> dict:
    """`python -m agentrl check --json` on the package copy under root -> its JSON (values, failed, errors)."""
    out = subprocess.run(check_command(model, rl, threads), cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
                         capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"returncode": out.returncode, "failed": [], "crashed": (out.stderr.strip().splitlines() or ["?"])[-1]}
    res = json.loads(lines[-1])
    if Path(res["package"]).resolve() != (root / "agentrl").resolve():
        raise RuntimeError(f"the check imported {res['package']}, not the copy under {root}")
    return res | {"returncode": out.returncode}


def run_mutation(mutation: Mutation | None, model: str, threads: int = 1) -> dict:
    """Preflight on a temporary copy of the package with `mutation` applied (None: the unmutated control)."""
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        copy_package(Path(tmp))
        if mutation is not None:
            apply(mutation, Path(tmp))
        return run_check(Path(tmp), model, mutation.rl if mutation else {}, threads)


def _fired(res: dict) -> str:
    if "crashed" in res:
        return f"check crashed: {res['crashed']}"
    parts = []
    for i in res["failed"]:
        check = res["checks"][i - 1]
        value, clears = res["values"][check], res["margins"].get(check)
        value = float("nan") if value is None else value  # NaN is null in a written JSON file
        err = res["errors"].get(check)
        parts.append(f"{i} `{check}` " + (f"(raised {err.split(':')[0]})" if err else
                                           f"({value:.3g}" + (f", {clears:.3g}x)" if clears else ")")))
    return "; ".join(parts) or "**none**"


def markdown(results: dict) -> str:
    """mutation -> what it does -> config -> invariants that fire (value, times past the threshold)."""
    lines = ["| mutation | file | one-line change | config | invariants that fire (value, times past threshold) |",
             "|---|---|---|---|---|"]
    for name, res in results.items():
        m = BY_NAME.get(name)
        where = f"`agentrl/{m.path}`" if m else "-"
        config = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in m.rl.items()) \
            if m and m.rl else "default"
        lines.append(f"| `{name}` | {where} | {m.what if m else 'unmutated copy (control)'} | {config} | "
                     f"{_fired(res)} |")
    return "\n".join(lines)


def _git(repo: Path, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def bisect_demo(name: str, model: str, workdir: Path, threads: int = 1) -> dict:
    """A temporary repository: the package (good), an unrelated commit, mutation `name`, another unrelated commit;
    then `git bisect run python -m agentrl check` -> {bad: the mutation's commit, named: the commit bisect named}."""
    mutation = BY_NAME[name]
    repo = workdir / "history"
    repo.mkdir(parents=True)
    copy_package(repo)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "demo@example.com")
    _git(repo, "config", "user.name", "demo")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "the trainer as it is")
    good = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "NOTES").write_text("an unrelated change\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "notes")
    apply(mutation, repo)
    _git(repo, "commit", "-qam", f"tidy {mutation.path}")
    bad = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "NOTES").write_text("another unrelated change\n")
    _git(repo, "commit", "-qam", "more notes")
    _git(repo, "bisect", "start", "HEAD", good)
    cmd = ["git", "bisect", "run"] + [a for a in check_command(model, mutation.rl, threads) if a != "--json"]
    out = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(repo)))
    found = re.search(r"^([0-9a-f]{40}) is the first bad commit", out.stdout, re.M)
    return {"mutation": name, "bad": bad, "named": found.group(1) if found else None, "stdout": out.stdout,
            "stderr": out.stderr}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentrl.faults.mutations", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=["control", *BY_NAME],
                   help="these mutations (default: the control and all)")
    p.add_argument("--model", default="data/models/base.pt")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--bisect", choices=list(BY_NAME), help="the bisect demo with this mutation")
    args = p.parse_args(argv)
    if args.bisect:
        with tempfile.TemporaryDirectory(prefix="bisect-") as tmp:
            res = bisect_demo(args.bisect, args.model, Path(tmp), args.threads)
        print(res["stdout"])
        print(f"bisect: the mutation {args.bisect} is commit {res['bad']}; git bisect named {res['named']}")
        return 0 if res["named"] == res["bad"] else 1
    names = args.only or ["control"] + list(BY_NAME)
    results = {}
    for name in names:
        results[name] = run_mutation(BY_NAME.get(name), args.model, args.threads)
        print(f"mutations: {name}: {_fired(results[name])}", file=sys.stderr, flush=True)
    if args.json:
        from agentrl.core.artifacts import write_json
        write_json(args.json, results)
    print(markdown(results))
    caught = all(res.get("failed") for n, res in results.items() if n != "control")
    control = results.get("control", {"failed": []})
    return 0 if caught and not control.get("failed") and "crashed" not in control else 1


if __name__ == "__main__":
    sys.exit(main())
