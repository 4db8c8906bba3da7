"""`python -m agentrl study labs`: the lab reports side by side with the book's Qwen3-0.6B run on the same statistics,
the committed recipes first (reports/labs/<recipe>/seed<N>.json), then the explored ones (reports/labs/explored/,
and runs made outside DVC, reports/labs/direct/), each recipe's seeds pooled -> reports/labs/comparison.{json,md}."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from agentrl.core.artifacts import REPORTS, read_json, write_json

REQUIRED = ("model", "parameters", "weights_changed", "held_out", "training", "before")
SEED_REPORT = re.compile(r"seed([0-9]+)\.json")
KEEP = ("model", "parameters", "weights_changed", "held_out", "training")


def current(numbers: dict) -> bool:
    """A report of this format: its columns, and an evaluation after GRPO unless a gate stopped the lab before."""
    return set(REQUIRED) <= set(numbers) and ("after" in numbers or bool(numbers.get("stopped")))


def recipes_in(directory: Path) -> dict:
    """{recipe: {seed: numbers}} of the recipes' directories under `directory` (<recipe>/seed<N>.json)."""
    out: dict = {}
    for path in sorted(directory.glob("*/seed*.json")):
        match = SEED_REPORT.fullmatch(path.name)
        if match and path.parent.name not in ("explored", "direct"):
            out.setdefault(path.parent.name, {})[int(match.group(1))] = read_json(path)
    return out


def task_sources(recipe: str, params_path: Path = Path("params.yaml")) -> tuple[str, str, str]:
    """(training tasks, held-out tasks, held-out split) of a committed recipe (agentrl.core.lab_config.LabRun), or
    the authored catalogue's where params.yaml does not name it."""
    from agentrl.core.config import read_params_file
    from agentrl.core.lab_config import LAB_CONFIGS, resolve
    if not params_path.is_file():
        return "authored", "authored", "heldout"
    lab = read_params_file(params_path).get("lab") or {}
    configs = lab.get("configs", LAB_CONFIGS)
    if recipe not in configs:
        return "authored", "authored", "heldout"
    return sources_of(resolve(configs, recipe, strict=False))


def sources_of(config: dict) -> tuple[str, str, str]:
    """(training tasks, held-out tasks, held-out split) of a recipe's keys, the authored catalogue's by default."""
    return config.get("tasks", "authored"), config.get("eval_tasks", "authored"), config.get("eval_split", "heldout")


def control_files(directory: Path, what: str) -> list[tuple[Path, dict]]:
    """(path, record) of each committed recipe's seed whose control `what` (temperatures or baselines) was run: by
    its verb (seed<N>.<what>.json, which wins) or by the lab itself (the `controls` of seed<N>.json), by path."""
    found = {}
    for path in directory.glob("*/seed*.json"):
        if SEED_REPORT.fullmatch(path.name) and path.parent.name not in ("explored", "direct"):
            kept = (read_json(path).get("controls") or {}).get(what)
            if kept:
                found[path.with_suffix(f".{what}.json")] = kept
    for path in directory.glob(f"*/seed*.{what}.json"):
        if path.parent.name not in ("explored", "direct"):
            found[path] = read_json(path)
    return sorted(found.items())


def temperature_tables(directory: Path) -> tuple[dict, list[str]]:
    """({"<recipe>/seed<N>": summary}, markdown) of every committed recipe's temperature grid (labtemps); where the
    recipe is held out on another task source, its pass@k at temperature 1 too (the cold start's pass@16 says
    whether the set can show more than sharpening)."""
    from agentrl.labs import passk
    from agentrl.labs.report import interval
    from agentrl.labs.temperatures import summary, table
    out, md = {}, []
    for path, grid in control_files(directory, "temperatures"):
        s = summary(grid, grid["seed"])
        key = f"{path.parent.name}/{path.name.split('.')[0]}"
        out[key] = s
        md += ["", f"### `{path.parent.name}` seed {grid['seed']} over sampling temperatures", "",
               f"Held-out pass of the lab's kept checkpoints at each temperature ({s['tasks']} tasks x "
               f"{grid['eval_per_task']} episodes, each cell its own stream; `python -m agentrl labtemps`):", "",
               *table(s, interval)]
        train, held, split = (grid["tasks"], grid["eval_tasks"], grid["eval_split"]) if "eval_tasks" in grid else \
            task_sources(path.parent.name, directory.parent.parent / "params.yaml")   # a grid before they were kept
        if held != "authored" and "1" in grid["cold_start"]:
            counts = {"before": grid["cold_start"]["1"]["per_task"], "after": grid["final"]["1"]["per_task"]}
            s["pass_at_k"] = passk.stats(counts, grid["seed"], 10_000)
            s["sources"] = {"tasks": train, "eval_tasks": held, "eval_split": split}
            md += ["", f"Trained on the {train} tasks; held out: the {held} tasks' {split} split ({s['tasks']} tasks; "
                   "reports/humaneval.md). pass@k at temperature 1 from the same episodes, the change paired over "
                   "tasks:", "", *passk.table(s["pass_at_k"], [("before", "after the cold start"),
                                                             ("after", "after GRPO")], interval)]
    return out, md


def baseline_tables(directory: Path) -> tuple[dict, list[str]]:
    """({"<recipe>/seed<N>": summary}, markdown) of every committed recipe's compute-matched baselines
    (labbaselines), each beside its own seed's report."""
    from agentrl.labs.baselines import summary, table
    from agentrl.labs.report import interval
    out, md = {}, []
    for path, arms in control_files(directory, "baselines"):
        seed_name = path.name.split(".")[0]
        record = read_json(path.with_name(f"{seed_name}.json"))
        s = summary(arms, record)
        out[f"{path.parent.name}/{seed_name}"] = s
        md += ["", f"### `{path.parent.name}` seed {arms['seed']}: GRPO beside compute-matched baselines", "",
               f"Each arm from the same kept cold start, {s['grpo_optimizer_steps']} Adam steps (GRPO's) at the cold "
               f"start's learning rate {record['config']['clone_lr']:g} (GRPO's: {record['config']['lr']:g}), "
               f"held-out pass@k over {s['tasks']} tasks x {arms['eval_per_task']} episodes on its own stream; "
               "`python -m agentrl labbaselines`:", "", *table(s, interval)]
    return out, md


def held_out_on(numbers: dict) -> str:
    """" (trained on X, held out on Y's split)" where a report's task sources are not the authored catalogue's, so a
    row on other tasks is not read beside the authored ones as if comparable; "" otherwise."""
    train, held, split = sources_of(numbers.get("config", {}))
    if (train, held, split) == ("authored", "authored", "heldout"):
        return ""
    return f" (trained on {train}, held out on {held} {split})"


def rows(recipes: dict) -> list[tuple[str, dict]]:
    """(label, numbers) of each seed's report, by recipe then seed."""
    return [(f"`{name}` seed {seed}{held_out_on(by_seed[seed])}", by_seed[seed])
            for name, by_seed in sorted(recipes.items()) for seed in sorted(by_seed)]


def split_current(recipes: dict) -> tuple[dict, list[str]]:
    """(the recipes' current reports, the labels of the reports that predate this format)."""
    keep, older = {}, []
    for name, by_seed in recipes.items():
        for seed, numbers in by_seed.items():
            if current(numbers):
                keep.setdefault(name, {})[seed] = numbers
            else:
                older.append(f"{name}/seed{seed}")
    return keep, sorted(older)


def comparison() -> int:
    from agentrl.core.artifacts import write_text
    from agentrl.labs.report import BOOK_QWEN3_06B, comparison_table
    from agentrl.labs.seeds import seeds_tables
    labs = REPORTS / "labs"
    committed, older = split_current(recipes_in(labs))
    explored, older_explored = split_current(recipes_in(labs / "explored"))
    direct = {}
    for p in sorted((labs / "direct").glob("*.json")):   # labs run outside DVC (agentrl.labs.direct)
        numbers = read_json(p)
        if "held_out" in numbers and current(numbers):   # a lab's report, not a labcheck verdict
            direct[f"direct/{p.stem}"] = numbers
    if not committed and not explored:
        print("error: no lab reports in reports/labs/<recipe>/; run a lab first (docs/labs.md)", file=sys.stderr)
        return 2
    table = comparison_table(rows(committed), book=True)
    pooled, seeds_md = seeds_tables(committed)
    tempered, temps_md = temperature_tables(labs)
    matched, baselines_md = baseline_tables(labs)
    explored_table = comparison_table(rows(explored) + [(f"`{n}`", r) for n, r in sorted(direct.items())])
    explored_pooled, explored_seeds_md = seeds_tables(explored, "reports/labs/explored")
    older += [f"explored/{n}" for n in older_explored]
    if older:
        explored_table += ["", f"Not in the tables (their reports predate this format; rerun the lab to compare): "
                               f"{', '.join(f'`{n}`' for n in older)}."]
    pick = lambda recipes: {n: {s: {k: r[k] for k in KEEP} for s, r in by.items()} for n, by in recipes.items()}
    write_json(labs / "comparison.json",
               {"book_qwen3_0_6b": BOOK_QWEN3_06B, "recipes": pick(committed), "seeds": pooled,
                "temperatures": tempered, "baselines": matched,
                "explored": pick(explored), "explored_seeds": explored_pooled,
                "direct": {n: {k: r[k] for k in KEEP} for n, r in direct.items()}, "not_compared": older})
    md = ["# The labs side by side", "",
          "Generated by `python -m agentrl study labs` from `reports/labs/<recipe>/seed<N>.json`. Held-out pass rates: "
          "per-task means with a 95% task-bootstrap interval; each gain the paired bootstrap difference over the same "
          "tasks. The book's row is its section 19.7 run on Qwen3-0.6B (reference figures, not ours).", "",
          "## The committed recipes", "", "The recipes of `lab.configs` in params.yaml (docs/labs.md).", "", *table,
          *(["", "### Seeds pooled", "",
             "Pooled: each held-out task's pass rate averaged over the recipe's seeds, then the same task bootstrap "
             "(agentrl/labs/seeds.py)."] if seeds_md else []), *seeds_md,
          *(["", "### Temperature as a control", "",
             "A cooler sampler can raise the cold start's pass without any training: GRPO's gain is stated over the "
             "cold start at its best temperature too (agentrl/labs/temperatures.py)."] if temps_md else []),
          *temps_md,
          *(["", "### More training, or the reward?", "",
             "GRPO's extra steps could be what helps, not its reward: the same number of Adam steps of more cloning, "
             "and of cloning the cold start's own passing episodes from GRPO's sampling budget (rejection sampling), "
             "beside it (agentrl/labs/baselines.py)."] if baselines_md else []),
          *baselines_md, "",
          "## Explored recipes", "",
          "The recipes tried while the committed ones were found, kept as history under `reports/labs/explored/` "
          "(each with its config and the commit it ran at; docs/labs_research.md says why each was tried), and labs "
          "run outside DVC (`reports/labs/direct/`).", "", *explored_table, *explored_seeds_md, ""]
    write_text(labs / "comparison.md", "\n".join(md))
    print("\n".join(table + seeds_md))
    return 0
