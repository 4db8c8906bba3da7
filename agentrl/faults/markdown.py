"""What the faults stage writes: per-run summaries, reports/faults.json, the MLflow rows, the figure specs and
reports/faults.md (the signature table, then one section per failure, then the runs)."""
from __future__ import annotations

from dataclasses import fields

from agentrl.core.config import RLConfig
from agentrl.faults.catalogue import EVAL_STREAM, FAILURE_NAMES, FAILURES, RUNS
from agentrl.faults.history import _finite, _fmt, _window, at, end_mean, eval_at, eval_points

SUMMARY_KEYS = ("reward", "pass_rate", "reads", "edits", "submitted", "turns", "malformed", "hardcode", "entropy",
                "approx_kl",
                "clip_frac", "ratio_max", "grad_norm", "zero_adv_frac", "logp_gap", "length_pass", "length_fail",
                "kl_ref")


CONTEXT_KEYS = ("reads", "edits", "submitted", "turns", "malformed", "hardcode", "entropy", "zero_adv_frac",
                "grad_norm")


def summarize(run: dict) -> dict:
    """Per-run summary: steps, wall time, first/last-window means of the main metrics, held-out evaluations."""
    h = run["history"]
    k = _window(len(h))
    pts = eval_points(h)
    keys = [key for key in SUMMARY_KEYS if any(key in r for r in h)]
    return {"steps": run["steps"], "steps_done": len(h), "bug": run["bug"],
            "stopped": run["stopped"], "window": k,
            "first": {key: end_mean(h, key, k, start=True) for key in keys},
            "last": {key: end_mean(h, key, k) for key in keys},
            "step0": {key: at(h, key) for key in keys},
            "heldout": [{"updates": u, "pass_rate": p} for u, p in pts],
            "heldout_start": pts[0][1] if pts else None, "heldout_end": pts[-1][1] if pts else None}


def end_heldout(runs: dict, name: str) -> tuple:
    """(faulty, twin) held-out pass rate at the faulty run's end (the same number of updates)."""
    n = len(runs[name]["history"])
    twin = runs.get(FAILURES[name].twin, {}).get("history", [])
    return eval_at(runs[name]["history"], n), eval_at(twin, n)


def verdict(res: dict) -> str:
    """'yes' (every check holds), 'partly' (some do), 'no'."""
    held = [c["holds"] for c in res["checks"]]
    return "yes" if all(held) else ("partly" if any(held) else "no")


def report_json(runs: dict, checks: dict, params: dict, base_cfg: RLConfig, eval_tasks: list, seed: int,
                figures: dict) -> dict:
    """Everything reports/faults.json holds (run states excluded)."""
    specs = {r.name: r for r in RUNS}
    fcfg = params["faults"]
    return {
        "faults_params": {f.name: getattr(fcfg, f.name) for f in fields(fcfg)},
        "length_params": {f.name: getattr(params["length"], f.name) for f in fields(params["length"])
                          if f.name != "seeds"},
        "base_config": base_cfg.to_dict(),
        "evaluation": {"tasks": [t.name for t in eval_tasks], "per_task": fcfg.eval_per_task,
                       "every": fcfg.eval_every, "seed": seed, "stream": EVAL_STREAM, "reward": "hidden"},
        "runs": {name: {"bug": run["bug"], "overrides": {k: run["config"][k] for k in specs[name].overrides},
                        "config": run["config"], "steps": run["steps"], "guard": run.get("guard"),
                        "stopped": run["stopped"], "summary": summarize(run), "history": run["history"]}
                 for name, run in runs.items()},
        "failures": {name: {"twin": FAILURES[name].twin,
                            "metrics": list(FAILURES[name].metrics + FAILURES[name].secondary),
                            "what": FAILURES[name].what, "why": FAILURES[name].why, "reference": REFERENCE.get(name),
                            "heldout_end": dict(zip(("faulty", "twin"), end_heldout(runs, name))),
                            "figure": figures.get(name)} for name in checks},
        "signatures": checks,
        "failure_order": [name for name in FAILURE_NAMES if name in checks],
        "holds": {name: verdict(res) for name, res in checks.items()},
        "required_hold": all(res["required_holds"] is not False for res in checks.values()),
    }


def mlflow_metrics(runs: dict, checks: dict) -> tuple[list[dict], dict]:
    """Rows for log_history (every run's dashboard, keys prefixed '<run>.') and flat per-run summary metrics."""
    rows: dict[int, dict] = {}
    for name, run in runs.items():
        for r in run["history"]:
            row = rows.setdefault(r["step"], {"step": r["step"]})
            row.update({f"{name}.{k}": v for k, v in r.items() if k != "step" and _finite(v)})
    summary = {}
    for name, run in runs.items():
        s = summarize(run)
        summary[f"{name}.seconds"] = run["seconds"]
        if s["heldout_end"] is not None:
            summary[f"{name}.heldout_end"] = s["heldout_end"]
        summary.update({f"{name}.last.{k}": v for k, v in s["last"].items() if _finite(v)})
    for name, res in checks.items():
        summary[f"signature.{name}"] = float(res["holds"])
        for i, c in enumerate(res["checks"]):
            for side in ("faulty", "healthy"):
                if _finite(c[side]):
                    summary[f"signature.{name}.{i}.{side}"] = c[side]
    return [rows[s] for s in sorted(rows)], summary


# ---------------------------------------------------------------- the markdown catalogue

REFERENCE = {  # the debugging chapter's reference signatures (textbook run, 24 steps), for comparison; not targets
    "mask_shift": "logp_gap ≈ 3.5 nats, grad_norm ≈ 0.5 → 1.5, held-out 0.47 vs 0.70.",
    "stale_old_logp": "clip_frac exactly 0, ratio exactly 1 all run.",
    "sampler_temp": "reads vanish, zero_adv_frac → 1, grad_norm → 0, held-out ≈ 0.15.",
    "sign_flip": "reward falls, turns rise.",
    "lr_high": "approx_kl ≈ 0.31 at step 0, malformed calls explode, reward → 0.",
    "accum_local": "no dashboard signature at all.",
    "entropy_sign": "entropy → 0.03, reads vanish, reward flat ≈ 0.18.",
    "length_bias": "failed episodes grow longer (≈ 21 → 34 policy tokens) while passed ones stay ≈ 13.",
    "public": "train reward → 0.97, hardcode → 0.97, held-out hidden pass → 0.",
    "ref_is_policy": "kl_ref exactly 0, run bit-identical to the no-KL run.",
}


def _value(c: dict, side: str) -> str:
    text = _fmt(c[side])
    if side == "faulty" and c.get("ratio") is not None:
        text += f" (× {_fmt(c['ratio'])})"
    if c.get(f"{side}_lo") is not None:
        text += f" [{_fmt(c[f'{side}_lo'])}, {_fmt(c[f'{side}_hi'])}]"
    start, end = c.get(f"{side}_start"), c.get(f"{side}_end")
    if start is not None and end is not None:
        text += f" ({_fmt(start)} → {_fmt(end)})"
    elif side == "faulty" and start is not None:
        text += f" (from {_fmt(start)})"
    return text


def signature_table(runs: dict, checks: dict) -> list[str]:
    """One row per signature check (plain markdown, no HTML); a failure's name and held-out numbers head its
    first row."""
    lines = ["| failure | exposing metric | faulty value | healthy value | held-out at end faulty vs healthy | "
             "signature holds? |", "|---|---|---|---|---|---|"]
    for name in FAILURE_NAMES:
        if name not in checks:
            continue
        res = checks[name]
        ef, eh = end_heldout(runs, name)
        held = f"{_fmt(ef)} vs {_fmt(eh)} (`{res['twin']}`, after {len(runs[name]['history'])} updates)"
        v = verdict(res)
        for i, c in enumerate(res["checks"]):
            mark = "yes" if c["holds"] else "**no**"
            head = f"[{name}](#{name})" if i == 0 else ""
            overall = f" (overall: {'**' + v + '**' if v != 'yes' else v})" if i == 0 else ""
            lines.append(f"| {head} | {c['metric']} ({c['statistic']}) | {_value(c, 'faulty')} | "
                         f"{_value(c, 'healthy')} | {held if i == 0 else ''} | {mark}{overall} |")
    return lines


def render_markdown(runs: dict, checks: dict, fcfg, threads: int, eval_tasks: list, figures: dict,
                    notes: dict | None = None) -> str:
    """reports/faults.md: the signature table, then one section per failure (fault, signature, measured numbers,
    figure via a relative link from `figures`), then the runs. `notes`: optional extra text per failure."""
    notes = notes or {}
    req_bad = [n for n, r in checks.items() if r["required_holds"] is False]
    ref_bad = [n for n, r in checks.items() if not r["holds"] and n not in req_bad]
    L = ["# Fault catalogue", "",
         "Every failure of the debugging chapter, trained from the same RL base and with the same seed as "
         "a healthy twin, with the dashboard metric that exposes it. Generated by `python -m stages.faults` "
         f"({threads} threads); every number is in `reports/faults.json`, and the stage's MLflow run and wall time "
         "in `reports/provenance/faults.json`.", "",
         "Runs: " + ", ".join(f"`{n}` ({r['steps']} steps)" for n, r in runs.items()) + ". "
         f"Held-out evaluation at step 0, every {fcfg.eval_every} steps and at the end, on the {len(eval_tasks)} "
         f"held-out tasks × {fcfg.eval_per_task} episodes with the hidden-test reward, from one evaluation seed "
         "shared by all runs (common random numbers).", "",
         "How to read it: *required* checks are the signatures the catalogue must show (also asserted by "
         "`tests/test_faults.py` on shortened runs); *reference* checks compare with the mechanism the debugging "
         "chapter reports for the textbook run and are reported whichever way they come out. \"Healthy\" values are "
         "the twin's over the same steps as the faulty run. In the figures the top row is the train reward per step "
         "(line) and the held-out hidden-test pass rate (points, at the number of updates done) for the faulty run "
         "(left) and its twin (right); the bottom row is the exposing metric on the same y-limits across the pair.", "",
         "## Signature table", ""]
    L += signature_table(runs, checks)
    L += [""]
    L.append(f"Required signatures: {sum(r['required_holds'] is not False for r in checks.values())}/{len(checks)} "
             "failures hold" + (f"; **not reproduced: {', '.join(req_bad)}**" if req_bad else "") + ". "
             + (f"Reference mechanisms not (fully) reproduced: **{', '.join(ref_bad)}** (see their sections)."
                if ref_bad else "Every reference mechanism reproduced."))
    L.append("")
    for name in FAILURE_NAMES:
        if name not in checks:
            continue
        fail, res = FAILURES[name], checks[name]
        s = summarize(runs[name])
        twin_h = runs[fail.twin]["history"] if fail.twin in runs else []
        L += [f"## {name}", "", f"**The fault.** {fail.what}", "", f"**The signature.** {fail.why}", ""]
        if name in REFERENCE:
            L += [f"Reference (the debugging chapter's textbook run; our numbers differ in detail): "
                  f"{REFERENCE[name]}", ""]
        L += [f"| check | kind | criterion | {name} | {fail.twin} | holds |", "|---|---|---|---|---|---|"]
        for c in res["checks"]:
            L.append(f"| {c['metric']} ({c['statistic']}) | {c['kind']} | {c['criterion']} | {_value(c, 'faulty')} | "
                     f"{_value(c, 'healthy')} | {'yes' if c['holds'] else '**no**'} |")
        for c in res["checks"]:
            if c.get("detail"):
                L += ["", f"{c['metric']}: {c['detail']}."]
        ef, eh = end_heldout(runs, name)
        L += ["", f"Held-out hidden-test pass: `{name}` {_fmt(s['heldout_start'])} → {_fmt(ef)}, `{fail.twin}` "
                  f"{_fmt(eval_at(twin_h, 0))} → {_fmt(eh)} (after {s['steps_done']} updates). Train reward, mean of "
                  f"the first / last {s['window']} steps: `{name}` {_fmt(s['first'].get('reward'))} → "
                  f"{_fmt(s['last'].get('reward'))}, `{fail.twin}` "
                  f"{_fmt(end_mean(twin_h[:s['steps_done']], 'reward', s['window'], start=True))}"
                  f" → {_fmt(end_mean(twin_h[:s['steps_done']], 'reward', s['window']))}.", ""]
        ctx = [k for k in CONTEXT_KEYS if k in s["last"]]
        L += [f"Other dashboard metrics, mean of the last {s['window']} steps, `{name}` vs `{fail.twin}`: "
              + ", ".join(f"{k} {_fmt(s['last'][k])} vs {_fmt(end_mean(twin_h[:s['steps_done']], k, s['window']))}"
                          for k in ctx) + ".", ""]
        if s["stopped"]:
            L += [f"The run stopped early: {s['stopped']}", ""]
        if res["required_holds"] is False:
            L += ["**The required signature did not reproduce with these params**; the values above are what was "
                  "measured.", ""]
        elif not res["holds"]:
            bad = [c["criterion"] for c in res["checks"] if not c["holds"]]
            L += ["**Not reproduced here:** " + "; ".join(bad) + ". The values above are what was measured.", ""]
        if notes.get(name):
            L += [notes[name], ""]
        if name in figures:
            L += [f"![{name} vs {fail.twin}]({figures[name]})", ""]
    L += ["## Runs", "", "The divergence guard (docs/guards.md) watches every run here without stopping it: the last "
          "column "
          "says where it would have stopped the run, and why.", "",
          "| run | bug | config overrides | steps | train reward first → last | held-out start → end | guard |",
          "|---|---|---|---|---|---|---|"]
    specs = {r.name: r for r in RUNS}
    for name, run in runs.items():
        s = summarize(run)
        ov = ", ".join(f"{k}={run['config'][k]}" for k in specs[name].overrides) or "—"
        L.append(f"| {name} | {run['bug'] or '—'} | {ov} | {s['steps_done']} | "
                 f"{_fmt(s['first'].get('reward'))} → {_fmt(s['last'].get('reward'))} | "
                 f"{_fmt(s['heldout_start'])} → {_fmt(s['heldout_end'])} | "
                 + (f"step {run['guard']['step']}: {run['guard']['reason']}" if run.get("guard") else "—") + " |")
    return "\n".join(L) + "\n"


def figure_specs(runs: dict) -> list[dict]:
    """Keyword arguments for agentrl.figures.fault_panel (plus 'name'), one per failure present with its twin;
    the twin's history is cut to the faulty run's length so both panels cover the same steps."""
    out = []
    for name in FAILURE_NAMES:
        fail = FAILURES[name]
        if name not in runs or fail.twin not in runs:
            continue
        n = len(runs[name]["history"])
        out.append({"name": name, "twin": fail.twin, "faulty": runs[name]["history"],
                    "healthy": runs[fail.twin]["history"][:n], "metrics": list(fail.metrics),
                    "secondary": list(fail.secondary), "log_metric": fail.log_metric, "hlines": list(fail.hlines)})
    return out
