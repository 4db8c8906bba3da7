"""Markdown tables of the research studies (agentrl.studies.research): what reports/research/<study>.md holds and
docs/research.md quotes. Rendering only: every number comes from the study's JSON."""
from __future__ import annotations


def _f(x, fmt=".3f") -> str:
    return "–" if x is None else format(x, fmt)


def _ci(v: dict, fmt=".3f") -> str:
    return f"{_f(v['mean'], fmt)} [{_f(v['ci_lo'], fmt)}, {_f(v['ci_hi'], fmt)}]"


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _versus(v: dict, ref: str, fmt="+.3f") -> list[str]:
    d = v.get(f"diff_vs_{ref}")
    if d is None:
        return ["(reference)", "", ""]
    power = "–" if d["power_now"] is None else f"{d['power_now']:.0%}"
    return [_ci(d, fmt), "–" if d["seeds_needed"] is None else str(d["seeds_needed"]), power]


def _seeds(v: dict, fmt=".3f") -> str:
    return ", ".join(_f(x, fmt) for x in v["per_seed"].values())


def entropy_collapse(out: dict) -> str:
    h, ent = out["heldout"], out["entropy"]
    rows = []
    for arm, v in h.items():
        fams = out["unsolved_by_family"][arm]
        unsolved = ", ".join(f"{f} ({n}/{len(out['seeds'])})" for f, n in fams.items() if n) or "none"
        rows.append([f"`{arm}`", f"{_f(v['mean'])} [{_f(v['ci_lo'])}, {_f(v['ci_hi'])}]", _f(v["seed_sd"]),
                     _seeds(v), *_versus(v, "default"), *(_f(ent[s][arm]) for s in ("10", "30", "60")),
                     _f(out["unsolved_families"][arm], ".2f"), unsolved])
    head = ["arm", "held-out pass [95% CI]", "seed SD", "per seed", "vs default [95% CI]", "seeds for 80% power",
            f"power at {len(out['seeds'])} seeds", "entropy @10", "@30", "@60", "unsolved families (mean)",
            "unsolved in (seeds)"]
    return (f"### Entropy collapse ({out['steps']} steps, seeds {out['seeds']}, {out['threads']} threads, "
            f"{out['eval_per_task']} episodes per held-out task)\n\n" + _table(head, rows) + "\n")


def rollout_efficiency(out: dict) -> str:
    h, g = out["heldout"], out["gain_per_1k"]
    rows = []
    for arm in h:
        thirds = " / ".join(_f(x, ".2f") for x in out["zero_adv_thirds"][arm])
        rows.append([f"`{arm}`", _f(out["rollouts"][arm], ".0f"), _f(out["trained_episodes"][arm], ".0f"),
                     f"{_f(h[arm]['mean'])} [{_f(h[arm]['ci_lo'])}, {_f(h[arm]['ci_hi'])}]",
                     _versus(h[arm], "default")[0],
                     f"{_f(g[arm]['mean'], '.4f')} [{_f(g[arm]['ci_lo'], '.4f')}, {_f(g[arm]['ci_hi'], '.4f')}]",
                     _seeds(g[arm], ".4f"), *_versus(g[arm], "default", "+.4f"), _f(out["zero_adv_mean"][arm], ".2f"),
                     thirds])
    head = ["arm", "rollouts", "trained on", "held-out pass [95% CI]", "vs default", "gain per 1k rollouts [95% CI]",
            "per seed", "vs default [95% CI]", "seeds for 80% power", f"power at {len(out['seeds'])} seeds",
            "zero-adv share", "by thirds of training"]
    return (f"### Rollout efficiency ({out['steps']} steps, seeds {out['seeds']}, {out['threads']} threads; start "
            f"held-out pass {_f(out['start_pass']['default'])})\n\n" + _table(head, rows) + "\n")


def stopping(out: dict) -> str:
    zero = out["zero_adv_frac"]
    ck = [[str(c["step"]), f"{_f(c['pass_rate'])} [{_f(c['ci_lo'])}, {_f(c['ci_hi'])}]",
           _f(sum(zero[max(c["step"] - 10, 0):c["step"]]) / max(min(c["step"], 10), 1), ".2f") if c["step"] else "–"]
          for c in out["checkpoints"]]
    full = out["test"][str(out["chosen"]["step"])]
    rules = [["full run (best validation)", "–", "0", str(out["chosen"]["step"]), _f(out["chosen"]["pass_rate"]),
              "–", f"{_f(full['pass_rate'])} [{_f(full['ci_lo'])}, {_f(full['ci_hi'])}]", "–"]]
    for name, v in out["rules"].items():
        t = out["test"][str(v["chosen_step"])]
        rules.append([f"{name} {v['rule']}", str(v["stop_step"]) if v["fired"] else "never", str(v["steps_saved"]),
                      str(v["chosen_step"]), _f(v["chosen_validation"]), _ci(v["validation_cost"], "+.3f"),
                      f"{_f(t['pass_rate'])} [{_f(t['ci_lo'])}, {_f(t['ci_hi'])}]", _ci(v["test_cost"], "+.3f")])
    return (f"### Stopping ({out['steps']} steps, {out['threads']} threads; first 60 steps equal to the main run's "
            f"validation: {out['matches_main_run_validation']})\n\n"
            + _table(["checkpoint", "validation [95% CI]", "zero-adv share, previous 10 steps"], ck) + "\n\n"
            + _table(["rule", "stops at", "steps saved", "picks", "validation", "validation cost [95% CI]",
                      "test pass [95% CI]", "test cost [95% CI]"], rules) + "\n")


RENDER = {"entropy-collapse": entropy_collapse, "rollout-efficiency": rollout_efficiency, "stopping": stopping}


def render(out: dict) -> str:
    return RENDER[out["study"]](out)
