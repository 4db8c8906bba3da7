"""The report's sections beyond the main run: ablation, what the agent learned, power, stopping signals, the
thread-count experiment, the fault catalogue and provenance."""
from __future__ import annotations

from agentrl.report.compute import (
    ABLATION,
    BEHAVIOUR,
    CAPSTONE,
    FAULTS,
    PREFLIGHT,
    SELECTION,
    START,
    TEST,
    THREADS,
    WRITTEN_BY,
)
from agentrl.report.sections_run import arm_order
from agentrl.report.sources import table

BEHAVIOUR_KEYS = ("pass_rate", "submitted", "reads", "read_first", "tests", "edits", "turns", "malformed",
                  "hardcode", "policy_tokens", "length_pass", "length_fail")


def sec_ablation(L, S, docs, links):
    abl = docs[ABLATION]
    arms = arm_order(docs)
    ref = abl["power"]["reference_arm"]
    L += ["## Ablation", "",
          f"Each arm trained for {S(ABLATION, 'steps', 'd')} steps with seeds "
          f"{S(ABLATION, 'seeds', 'list')}, then evaluated on the held-out tasks "
          f"({S(ABLATION, 'eval_per_task', 'd')} episodes each; the evaluation stream depends on the seed only). "
          f"Held-out: mean over seeds with a {S(CAPSTONE, 'ci_level.ablate', '.0%')} task-bootstrap interval of the "
          f"seed-averaged per-task rates; difference vs {ref}: paired over tasks. Late reward / entropy / hardcode: "
          f"mean over the final training steps, averaged over seeds.", ""]
    rows = []
    for a in arms:
        per_seed = ", ".join(S(ABLATION, f"arms.{a}.per_seed.{s}") for s in abl["arms"][a]["per_seed"])
        diff = (f"{S(ABLATION, f'arms.{a}.diff_vs_default.mean', '+.3f')} "
                f"{S.ci(ABLATION, f'arms.{a}.diff_vs_default.ci_lo', f'arms.{a}.diff_vs_default.ci_hi', '+.3f')}"
                if "diff_vs_default" in abl["arms"][a] else "(reference)")
        rows.append([f"`{a}`", f"{S(ABLATION, f'arms.{a}.heldout_pass')} "
                               f"{S.ci(ABLATION, f'arms.{a}.ci_lo', f'arms.{a}.ci_hi')}",
                     S(ABLATION, f"arms.{a}.seed_sd"), per_seed, S(ABLATION, f"arms.{a}.late_reward"),
                     S(ABLATION, f"arms.{a}.late_entropy"), S(ABLATION, f"arms.{a}.late_hardcode"), diff])
    L += table(["arm", "held-out [CI]", "seed SD", f"per seed ({S(ABLATION, 'seeds', 'list')})",
                 "late train reward", "late entropy", "late hardcode", f"diff vs {ref} [CI]"], rows)
    ident = abl.get("default_matches_main_run", {})
    if ident.get("checked"):
        L += [f"The `default` arm with seed {S(ABLATION, 'default_matches_main_run.seed', 'd')} equals the main run "
              f"at step {S(ABLATION, 'default_matches_main_run.step', 'd')} parameter for parameter: "
              f"{S(ABLATION, 'default_matches_main_run.equal', 'yesno')} (checkpoint evaluation did not perturb "
              f"training).", ""]
    L += [f"![Ablation forest plot]({links['ablation_forest']})", ""]


def sec_learned(L, S, docs, links):
    ln = docs[BEHAVIOUR]
    L += ["## What the agent learned", "",
          f"The chosen checkpoint (step {S(SELECTION, 'chosen.step', 'd')}) and the starting policy, re-evaluated on "
          f"every held-out task ({S(BEHAVIOUR, 'episodes_per_task', 'd')} episodes per task, "
          f"{S(BEHAVIOUR, 'chosen.episodes', 'd')} per policy, generator seed "
          f"`{S(BEHAVIOUR, 'generator', 'str')}`, the same for both).", "",
          "Behaviour per episode:", ""]
    labels = {"pass_rate": "hidden-test pass", "submitted": "submitted", "reads": "reads", "read_first": "read first",
              "tests": "tests", "edits": "edits", "turns": "turns", "malformed": "malformed calls",
              "hardcode": "hardcode_tests used", "policy_tokens": "policy tokens",
              "length_pass": "policy tokens, passed episodes", "length_fail": "policy tokens, failed episodes"}
    rows = []
    for k in BEHAVIOUR_KEYS:
        fmt = ".1f" if k in ("policy_tokens", "length_pass", "length_fail") else ".3f"
        rows.append([labels[k], S(BEHAVIOUR, f"start.behavior.{k}", fmt),
                     S(BEHAVIOUR, f"chosen.behavior.{k}", fmt)])
    L += table(["", "start", "chosen"], rows)
    for who in ("chosen", "start"):
        L += [f"The {S(BEHAVIOUR, 'top_k', 'd')} most frequent tool sequences, {who} "
              f"({S(BEHAVIOUR, f'{who}.distinct_sequences', 'd')} distinct sequences in all):", ""]
        rows = []
        for i, _ in enumerate(ln[who]["top_sequences"]):
            rows.append([f"`{S(BEHAVIOUR, f'{who}.top_sequences.{i}.sequence', 'str')}`",
                         S(BEHAVIOUR, f"{who}.top_sequences.{i}.count", "d"),
                         S(BEHAVIOUR, f"{who}.top_sequences.{i}.share", ".3f")])
        L += table(["tool sequence", "episodes", "share"], rows)
    L += ["First edit op per held-out task, chosen checkpoint (bold: the task's oracle op; `none`: no edit):", ""]
    rows = []
    for task in ln["tasks"]:
        cells = []
        for op in ln["ops"]:
            text = S(BEHAVIOUR, f"chosen.first_ops.{task}.{op}", "d")
            cells.append(f"**{text}**" if op == ln["oracle"][task] else text)
        rows.append([f"`{task}`", f"`{S(BEHAVIOUR, f'oracle.{task}', 'str')}`"] + cells +
                    [f"{S(BEHAVIOUR, f'chosen.per_task.{task}.c', 'd')} of "
                     f"{S(BEHAVIOUR, f'chosen.per_task.{task}.n', 'd')}"])
    L += table(["task", "oracle"] + [f"`{op}`" for op in ln["ops"]] + ["passed"], rows)
    L += [f"![First edit op per held-out task]({links['op_choices']})", "",
          f"Failed episodes of the chosen checkpoint, up to "
          f"{S(CAPSTONE, 'config.behaviour.transcripts_per_family', 'd')} per bug family, decoded token by token "
          f"(prompt, then each call and the observation it got):", ""]
    fams = ln["chosen"]["families"]
    pinned = docs[CAPSTONE]["config"]["tasks"]["families"]
    for fam in [f for f in pinned if f in fams] + sorted(f for f in fams if f not in pinned):
        v = fams[fam]
        if v["failures"] == 0:
            L += [f"- `{fam}`: no failure in {S(BEHAVIOUR, f'chosen.families.{fam}.episodes', 'd')} episodes.", ""]
            continue
        if not v["transcripts"]:
            L += [f"- `{fam}` (failed {S(BEHAVIOUR, f'chosen.families.{fam}.failures', 'd')} of "
                  f"{S(BEHAVIOUR, f'chosen.families.{fam}.episodes', 'd')} episodes): no transcript shown "
                  "(behaviour.transcripts_per_family = "
                  f"{S(CAPSTONE, 'config.behaviour.transcripts_per_family', 'd')}).", ""]
        for j, tr in enumerate(v["transcripts"]):
            p = f"chosen.families.{fam}.transcripts.{j}"
            L += [f"- `{fam}` (failed {S(BEHAVIOUR, f'chosen.families.{fam}.failures', 'd')} of "
                  f"{S(BEHAVIOUR, f'chosen.families.{fam}.episodes', 'd')} episodes). Task "
                  f"`{S(BEHAVIOUR, f'{p}.task', 'str')}`, edit ops {S(BEHAVIOUR, f'{p}.ops', 'list')}, submitted "
                  f"{S(BEHAVIOUR, f'{p}.submitted', 'yesno')}, public tests pass "
                  f"{S(BEHAVIOUR, f'{p}.public_pass', 'yesno')}, hidden tests pass "
                  f"{S(BEHAVIOUR, f'{p}.hidden_pass', 'yesno')}, reward {S(BEHAVIOUR, f'{p}.reward', 'g')}:", "",
                  "```text"] + tr["lines"] + ["```", ""]
    if not ln["chosen"]["families"]:
        L += ["(No families configured.)", ""]


def sec_power(L, S, docs):
    abl = docs[ABLATION]
    L += ["## Power", "",
          f"Seeds per arm needed to detect a held-out difference with power "
          f"{S(ABLATION, 'power.power', '.0%')} (two-sided two-sample t-test at level "
          f"{S(ABLATION, 'power.alpha', 'g')}) given the measured seed SD of the "
          f"`{S(ABLATION, 'power.reference_arm', 'str')}` arm ({S(ABLATION, 'power.seed_sd')}); tasks needed (paired "
          f"one-sample t-test on per-task differences, same power and level) given the per-task SD of its "
          f"seed-averaged rates ({S(ABLATION, 'power.task_sd')}).", ""]
    rows = [[S(ABLATION, f"power.rows.{i}.effect", ".2f"), S(ABLATION, f"power.rows.{i}.seeds_per_arm", "d"),
             S(ABLATION, f"power.rows.{i}.tasks", "d")] for i in range(len(abl["power"]["rows"]))]
    L += table(["effect", "seeds per arm", "tasks"], rows)


def sec_stopping(L, S, docs, links):
    st = docs[CAPSTONE]["stopping"]
    pk = st["peak_index"]
    L += ["## Stopping signals", "",
          "A group whose episodes all pass (or all fail) has zero advantage and gives no gradient. Validation pass "
          "rate at each checkpoint against the zero-advantage share of the batch sampled at that step:", "",
          f"![Stopping signals]({links['stopping_signals']})", ""]
    rows = []
    for i, _ in enumerate(st["rows"]):
        p = f"stopping.rows.{i}"
        rows.append([S(CAPSTONE, f"{p}.step", "d"), S(CAPSTONE, f"{p}.pass_rate"), S(CAPSTONE, f"{p}.zero_adv_frac"),
                     S(CAPSTONE, f"{p}.all_pass_frac"), S(CAPSTONE, f"{p}.all_fail_frac")])
    L += table(["step", "validation pass", "zero-advantage share", "all-pass share", "all-fail share"], rows)
    peak_zero = st["peak"]["zero_adv_frac"]
    where = (f"the batch sampled at that step had zero-advantage share "
             f"{S(CAPSTONE, f'stopping.rows.{pk}.zero_adv_frac')} (all-pass "
             f"{S(CAPSTONE, f'stopping.rows.{pk}.all_pass_frac')}, all-fail "
             f"{S(CAPSTONE, f'stopping.rows.{pk}.all_fail_frac')})") if peak_zero is not None else \
        "the run has no dashboard row for that step (it is the final checkpoint)"
    first_full = (f" Every group of a batch first had zero advantage at step "
                  f"{S(CAPSTONE, 'stopping.first_step_all_groups_zero_adv', 'd')}."
                  if st["first_step_all_groups_zero_adv"] is not None else "")
    L += [f"Validation peaked at step {S(CAPSTONE, f'stopping.rows.{pk}.step', 'd')} "
          f"({S(CAPSTONE, f'stopping.rows.{pk}.pass_rate')}); {where}. Over the last "
          f"{S(CAPSTONE, 'stopping.window', 'd')} steps the zero-advantage share averaged "
          f"{S(CAPSTONE, 'stopping.last.zero_adv_frac')} (all-pass {S(CAPSTONE, 'stopping.last.all_pass_frac')}, "
          f"all-fail {S(CAPSTONE, 'stopping.last.all_fail_frac')})"
          + (": most groups pass in full, so training signal runs out as the policy saturates."
             if st["late_mostly_all_pass"] else ".") + first_full, ""]


def sec_threads(L, S, docs, links):
    th, te = docs[THREADS], docs[CAPSTONE]["threads"]
    first = (f"the sampled batches first differ at step {S(THREADS, 'first_divergent_step', 'd')}"
             if th.get("first_divergent_step") is not None else
             f"the sampled batches never differ (identical: {S(THREADS, 'identical_batches', 'yesno')})")
    L += ["## Thread-count experiment", "",
          f"The first {S(THREADS, 'steps', 'd')} steps of the main run repeated at "
          f"{S(THREADS, 'compare_threads', 'd')} thread(s) against the main run's {S(THREADS, 'main_threads', 'd')}: "
          f"{first}; the largest parameter difference at step {S(THREADS, 'steps', 'd')} is "
          f"{S(THREADS, 'max_param_diff', '.3g')}.", ""]
    rows = [[f"{S(THREADS, 'main_threads', 'd')} (main run)", S(THREADS, "heldout_main")],
            [S(THREADS, "compare_threads", "d"), S(THREADS, "heldout_compare")]]
    L += table(["threads", "held-out pass"], rows)
    verdict = "within" if te["within_seed_sd"] else "outside"
    L += [f"Held-out difference {S(CAPSTONE, 'threads.heldout_diff', '+.3f')}, against a seed SD of "
          f"{S(CAPSTONE, 'threads.seed_sd')} in the `{S(CAPSTONE, 'threads.reference_arm', 'str')}` ablation arm "
          f"(the same steps and starting policy): {S(CAPSTONE, 'threads.diff_in_seed_sds', '.2f')} seed SDs, "
          f"{verdict} one seed SD (within one seed SD: {S(CAPSTONE, 'threads.within_seed_sd', 'yesno')}; within the "
          f"seed range {S(CAPSTONE, 'threads.seed_range')}: {S(CAPSTONE, 'threads.within_seed_range', 'yesno')}). "
          f"Bit-identical across thread counts: {S(CAPSTONE, 'threads.bit_identical', 'yesno')}. The thread count "
          f"is therefore pinned as a param (`run.threads`): changing it reruns every stage that does tensor work.",
          "",
          f"![Thread-count experiment]({links['threads']})", ""]


def signature_rows(faults: dict) -> list[tuple[str, str, str, dict]]:
    """(failure, twin, path prefix, check) for every signature check in faults.json, in the catalogue's order."""
    block = faults["signatures"]
    return [(name, block[name].get("twin"), f"signatures.{name}", c) for name in faults["failure_order"]
            for c in block[name]["checks"]]


def sec_faults(L, S, docs):
    faults = docs[FAULTS]
    L += ["## Fault catalogue", ""]
    L += ["Every failure of the debugging chapter, trained from the same base and seed as a healthy twin, with the "
          "dashboard metric that exposes it; per-failure figures and explanations in [faults.md](faults.md). "
          "Required checks are the signatures the catalogue must show; reference checks compare with the textbook "
          "run and are reported, not asserted.", ""]
    L += [f"Failures whose required signature reproduced: {S(CAPSTONE, 'faults.required_hold', 'd')} of "
          f"{S(CAPSTONE, 'faults.failures', 'd')}; with every check (reference ones too): "
          f"{S(CAPSTONE, 'faults.all_checks_hold', 'd')}.", ""]
    rows, seen = [], {}
    failures = faults.get("failures", {})
    for name, twin, prefix, c in signature_rows(faults):
        i = seen[name] = seen.get(name, -1) + 1
        p = f"{prefix}.checks.{i}"

        def val(field, c=c, p=p):
            v = c.get(field)
            if v is None:
                return "n/a"
            if isinstance(v, bool):
                return S(FAULTS, f"{p}.{field}", "yesno")
            if isinstance(v, (int, float)):
                return S(FAULTS, f"{p}.{field}", ".3g")
            return S(FAULTS, f"{p}.{field}", "str") if isinstance(v, str) else "see faults.md"
        first = i == 0
        label = f"`{name}`" + (f" (twin `{S(FAULTS, f'{prefix}.twin', 'str')}`)" if twin else "") if first else ""
        held = ""
        if first and isinstance(failures.get(name, {}).get("heldout_end"), dict):
            q = f"failures.{name}.heldout_end"
            held = f"{S(FAULTS, f'{q}.faulty', '.3f')} vs {S(FAULTS, f'{q}.twin', '.3f')}"
        rows.append([label, f"{S(FAULTS, f'{p}.metric', 'str')} ({S(FAULTS, f'{p}.statistic', 'str')})",
                     S(FAULTS, f"{p}.kind", "str") if "kind" in c else "", val("faulty"), val("healthy"),
                     S(FAULTS, f"{p}.criterion", "str"), S(FAULTS, f"{p}.holds", "yesno"), held])
    if rows:
        L += table(["failure", "exposing metric (statistic)", "check", "faulty", "twin", "criterion", "holds",
                     "held-out at end, faulty vs twin"], rows)
    else:
        L += ["(faults.json holds no signature table.)", ""]


def sec_provenance(L, S, docs):
    L += ["## Provenance", "",
          "Where each headline number comes from: the stage output and path, and the stage that wrote it. `python -m "
          "agentrl audit <file>:<path>` prints the params, inputs, code files, thread count and library versions that "
          "produced it, its MLflow run, and whether it is current, agreeing with `dvc status`. The MLflow run id, "
          "params hash, git commit and wall time of every stage run are in [provenance/](provenance/README.md) "
          "(written beside the report, not into it: the report depends only on what made it).", ""]
    heads = [("test pass@1, chosen", TEST, "chosen.pass_at_1", ".3f"),
             ("test pass@1, start", TEST, "start.pass_at_1", ".3f"),
             ("paired difference", TEST, "paired_diff.mean", "+.3f"),
             ("validation pass, chosen checkpoint", SELECTION, "chosen.pass_rate", ".3f"),
             ("chosen step", SELECTION, "chosen.step", "d"),
             ("ablation default held-out", ABLATION, "arms.default.heldout_pass", ".3f"),
             ("ablation seed SD", ABLATION, "power.seed_sd", ".3f"),
             ("base pass@1 (train tasks)", START, "base.pass_at_1", ".3f"),
             ("clean sampler-trainer gap", PREFLIGHT, "clean.sampler_trainer_gap.value", ".3g"),
             ("thread experiment max parameter difference", THREADS, "max_param_diff", ".3g"),
             ("learned: chosen hidden-test pass", BEHAVIOUR, "chosen.behavior.pass_rate", ".3f"),
             ("thread effect in seed SDs", CAPSTONE, "threads.diff_in_seed_sds", ".2f")]
    for a in arm_order(docs):
        if "diff_vs_default" in docs[ABLATION]["arms"][a]:
            heads.append((f"ablation {a} − default", ABLATION, f"arms.{a}.diff_vs_default.mean", "+.3f"))
    rows = [[label, S(file, path, fmt), f"`{file}:{path}`", f"`{WRITTEN_BY[file]}`"]
            for label, file, path, fmt in heads if S.has(file, path)]
    L += table(["number", "value", "source", "stage"], rows)
    L += ["Every number in this report is listed with its source in `reports/capstone_sources.json`; the numbers the "
          "report computed itself (window means, the stopping and thread comparisons) are in `reports/capstone.json`.",
          ""]
