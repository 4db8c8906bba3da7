"""One recipe at several seeds: the seed is the instance's (--seed, lab.seeds), never a config key; the instance names
its stage and its report (reports/labs/<lab>/seed<N>); an explored recipe runs from its config file beside its
reports; and study labs pools a recipe's seeds by name and seed (each task's rate averaged over the seeds, then the
task bootstrap), on hand-computed vectors."""
import json

import pytest

from agentrl.core.config import UserError, lab_run, load_section
from agentrl.labs.report import lab_report
from agentrl.labs.seeds import pooled


def _counts(*passes: int, n: int = 4) -> dict:
    return {f"t{i}": {"c": c, "n": n} for i, c in enumerate(passes)}


def _lab(seed: int, before: dict, after: dict, **config) -> dict:
    """A lab's numbers as lab_report writes them, from per-task counts."""
    record = {"seed": seed, "lab": f"lab{seed}", "config": {"environment": "gym", "lr": 3e-6, **config},
              "before": {"per_task": before, "malformed": 0.0}, "after": {"per_task": after, "malformed": 0.0},
              "history": [{"entropy": 0.1, "updated": True}], "model": "M", "parameters": 10,
              "architecture": "A", "cold_start": {}, "weights_changed": True}
    numbers = {k: v for k, v in record.items() if k != "history"}
    from agentrl.labs.report import held_out_stats, training_stats
    numbers.update({"held_out": held_out_stats(record, seed), "training": training_stats(record["history"])})
    return numbers


def test_a_labs_seed_drives_its_streams_and_its_rl_config():
    import agentrl.rl.variants  # noqa: F401  (the rl section names registered variants)
    from agentrl.labs.recipe import rl_config
    rl = load_section("rl", {"rl": {}}, seed=7)
    run = lab_run("a", {})
    assert rl_config(rl, run, 3).seed == 3 and rl_config(rl, run, 0).seed == 0


def test_a_seed_is_an_instance_not_a_config(tmp_path):
    """--lab NAME --seed N names the recipe's instance, its stage and its report; a bad seed is one line."""
    from agentrl.labs.instance import named
    lab = load_section("lab", {"lab": {"configs": {"smol": {"steps": 3}, "other": {"base": "smol", "lr": 1.0e-5}}}})
    inst = named(lab, "other", None, 3)
    assert (inst.stage, inst.report.as_posix(), inst.spec) == \
        ("lab@other-3", "reports/labs/other/seed3", {"steps": 3, "lr": 1.0e-5})
    assert inst.work_dir.as_posix() == "data/labs/other/seed3" and named(lab, "smol", None, None).seed == 0
    assert inst.logged(lab) == {"device": "cpu", "eval_batch": 40, "seed": 3, "configs": {"other": inst.spec}}
    for args, message in ((("nope", None, 1), "--lab: unknown value 'nope'; allowed: smol, other"),
                          (("smol", None, -1), "--seed: expected an integer in"),
                          ((None, None, 1), "lab: name the recipe with --lab NAME"),
                          (("smol", "x/config.yaml", 1), "lab: name the recipe with --lab NAME")):
        with pytest.raises(UserError, match=message) as err:
            named(lab, *args)
        assert "\n" not in str(err.value)


def test_an_explored_recipe_runs_from_its_config_file_beside_its_reports(tmp_path, monkeypatch):
    from agentrl.labs.instance import named
    monkeypatch.chdir(tmp_path)
    lab = load_section("lab", {"lab": {"configs": {"smol": {"steps": 3, "rl": {"kl_coef": 0.1}}}}})
    home = tmp_path / "reports" / "labs" / "explored" / "idea"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("# my idea\nbase: smol\nlr: 3.0e-5\nrl: {keep: informative}\n")
    inst = named(lab, None, "reports/labs/explored/idea/config.yaml", 2)
    assert inst.spec == {"steps": 3, "lr": 3.0e-5, "rl": {"kl_coef": 0.1, "keep": "informative"}}
    assert (inst.stage, inst.report.as_posix()) == ("lab@explored.idea-2", "reports/labs/explored/idea/seed2")
    assert inst.logged(lab)["config_file"] == "reports/labs/explored/idea/config.yaml"
    assert named(lab, None, str(home / "config.yaml"), 0).name == "idea"   # an absolute path inside the tree
    (home / "config.yaml").write_text("base: smol\nsteps: 0\n")
    with pytest.raises(UserError, match=r"reports/labs/explored/idea/config.yaml.steps: expected an integer"):
        named(lab, None, "reports/labs/explored/idea/config.yaml", 0)
    (home / "config.yaml").write_text("base: smol\nseed: 1\n")
    with pytest.raises(UserError, match=r"config.yaml.seed: a seed is not part of a lab's config"):
        named(lab, None, "reports/labs/explored/idea/config.yaml", 0)
    (tmp_path / "elsewhere.yaml").write_text("steps: 3\n")
    with pytest.raises(UserError, match=r"--config: elsewhere.yaml: a recipe's config is "
                                        r"reports/labs/explored/<recipe>/config.yaml"):
        named(lab, None, "elsewhere.yaml", 0)
    with pytest.raises(UserError, match=r"--config: reports/labs/explored/none/config.yaml: file not found"):
        named(lab, None, "reports/labs/explored/none/config.yaml", 0)


def test_the_committed_seeds_are_one_recipe_by_name(repo_root):
    """The committed menu recipe's seeds are files of one directory, each run from the same config at its seed."""
    for seed in (0, 1, 2):
        numbers = json.loads((repo_root / f"reports/labs/smollm2/seed{seed}.json").read_text())
        assert numbers["seed"] == seed and numbers["config"]["clone_steps"] == 192


def test_pooled_averages_each_task_over_the_seeds_then_bootstraps_tasks():
    # seed 0: before [0, .5], after [.5, .5]; seed 1: before [0, 0], after [1, .5]
    # pooled per task: before [0, .25], after [.75, .5]; paired differences [.75, .25]
    a = _lab(0, _counts(0, 2), _counts(2, 2))
    b = _lab(1, _counts(0, 0), _counts(4, 2))
    p = pooled([a, b], seed=0)
    assert p["seeds"] == [0, 1] and p["tasks"] == 2
    assert p["before"]["mean"] == pytest.approx(0.125) and p["after"]["mean"] == pytest.approx(0.625)
    assert p["gain"]["mean"] == pytest.approx(0.5)
    # two tasks: a resample's mean difference is .25, .5 or .75, so the 95% interval is [.25, .75]
    assert (p["gain"]["lo"], p["gain"]["hi"]) == pytest.approx((0.25, 0.75))
    # the seeds' own gains: +.25 and +.75
    assert p["seed_gains"]["min"] == pytest.approx(0.25) and p["seed_gains"]["max"] == pytest.approx(0.75)


def test_seeds_on_different_task_sets_are_not_pooled():
    a = _lab(0, _counts(0, 2), _counts(2, 2))
    b = _lab(1, _counts(0, 0, 1), _counts(4, 2, 1))
    with pytest.raises(ValueError, match="task sets differ"):
        pooled([a, b], seed=0)


def test_the_labs_study_shows_each_seed_and_the_pooled_gain(tmp_path, monkeypatch, capsys):
    from agentrl import cli
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports" / "labs" / "smol").mkdir(parents=True)
    for seed, numbers in ((0, _lab(0, _counts(0, 2), _counts(2, 2))), (1, _lab(1, _counts(0, 0), _counts(4, 2)))):
        (tmp_path / "reports" / "labs" / "smol" / f"seed{seed}.json").write_text(json.dumps(numbers))
    assert cli.main(["study", "labs"]) == 0
    md = (tmp_path / "reports" / "labs" / "comparison.md").read_text()
    assert "### `smol` at 2 seeds" in md
    assert "| 1 | 0.000 [0.000, 0.000] (no episode succeeded) | 0.750 [0.500, 1.000] | " \
           "+0.750 [+0.500, +1.000] | 1 of 1 |" in md
    assert "| pooled (2 tasks, each the mean of its seeds) | 0.125 [0.000, 0.250] | 0.625 [0.500, 0.750] | " \
           "**+0.500 [+0.250, +0.750]** | |" in md
    assert "The pooled gain excludes 0." in md
    numbers = json.loads((tmp_path / "reports" / "labs" / "comparison.json").read_text())
    assert numbers["seeds"]["smol"]["reports"] == ["reports/labs/smol/seed0.json", "reports/labs/smol/seed1.json"]


@pytest.mark.slow   # a subprocess (the module's imports)
def test_a_direct_lab_with_a_wrong_name_is_one_line_before_anything_is_written(tmp_path, repo_root):
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "agentrl.labs.direct", "--lab", "nope", "--device", "cpu",
                           "--out", str(tmp_path / "out")], cwd=repo_root, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: --lab: unknown value 'nope'; allowed: menu")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_direct_lab_runs_outside_dvc_and_records_where_it_ran(tmp_path, repo_root, qwen3_tokenizer):
    """The lab without DVC or MLflow (agentrl.labs.direct) on a shortened menu config at a lab seed of its own: the
    same report as the stage's, with the device, versions, numerics and commit it ran at."""
    import os
    import subprocess
    import sys

    import yaml
    from test_labs import SHORT_LAB
    params = tmp_path / "params.yaml"   # a checkout of its own: its data/ is the test's, the tokenizer linked in
    menu = SHORT_LAB["configs"]["menu"]
    committed = yaml.safe_load((repo_root / "params.yaml").read_text())
    params.write_text(yaml.safe_dump({**committed, "lab": {**SHORT_LAB, "runs": [], "configs": {"menu": menu}}}))
    (tmp_path / "data" / "tokenizers").mkdir(parents=True)
    (tmp_path / "data" / "tokenizers" / "qwen3").symlink_to(qwen3_tokenizer)
    # git must not find a repository above the test's directory (a temporary directory may sit inside one)
    env = {**os.environ, "PYTHONPATH": str(repo_root), "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}
    done = subprocess.run([sys.executable, "-m", "agentrl.labs.direct", "--lab", "menu", "--seed", "5", "--device",
                           "cpu", "--out", "out", "--threads", "2"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    numbers = json.loads((tmp_path / "out" / "menu-seed5-cpu-fp32.json").read_text())
    md = (tmp_path / "out" / "menu-seed5-cpu-fp32.md").read_text()
    assert numbers["seed"] == 5 and numbers["device"] == "cpu" and "before" in numbers["held_out"]
    run = numbers["direct_run"]
    assert run["threads"] == 2 and run["numerics"] == "portable" and run["transformers"]
    assert run["git"] is None   # no repository here: no commit claimed
    assert (tmp_path / "data" / "models" / "lab-direct-menu-seed5-cpu-fp32" / "config.json").is_file()
    assert md.startswith("# Lab `menu` seed 5")


@pytest.mark.parametrize("device, text", [("cuda", "trained with GRPO on a CUDA GPU."),
                                          ("cpu", "trained with GRPO on CPU.")])
def test_a_labs_report_names_the_device_it_trained_on(repo_root, device, text):
    """The committed GPU run's record, rebuilt without its per-step history, reported as run on each device."""
    numbers = json.loads((repo_root / "reports/labs/direct/smollm2-cuda-fp32.json").read_text())
    record = {k: v for k, v in numbers.items() if k not in ("held_out", "training", "device_run")}
    _, md = lab_report({**record, "history": [], "device": device})
    assert text in md and md.count("trained with GRPO on") == 1


@pytest.mark.parametrize("kl_coef, text", [(0.2, "KL penalty 0.2 (k3, to the cold start), KL bound"),
                                           (0.0, "temperature 1.0, KL bound")])
def test_a_labs_report_names_its_kl_penalty_only_where_it_has_one(repo_root, kl_coef, text):
    numbers = json.loads((repo_root / "reports/labs/direct/smollm2-cuda-fp32.json").read_text())
    record = {k: v for k, v in numbers.items() if k not in ("held_out", "training", "device_run")}
    rl = {**record["rl"], "kl_coef": kl_coef, "kl_kind": "k3", "temperature": 1.0}
    _, md = lab_report({**record, "rl": rl, "history": []})
    assert text in md and md.count("KL penalty") == (1 if kl_coef else 0)


@pytest.mark.parametrize("changes, text", [
    ({"task_draw": "families"}, "episodes, tasks drawn one per family in turn, Adam at lr"),
    ({"p_rename_operands": 0.5}, "episodes, operands under filler names in 50% of training episodes (held-out: the "
                                 "authored source), Adam at lr"),
    ({"p_rename_operands": 1.0}, "episodes, operands under filler names in every training episode (held-out: the "
                                 "authored source), Adam at lr"),
    ({}, "episodes, Adam at lr")])
def test_a_labs_report_names_its_task_draw_and_renamed_operands_only_where_set(repo_root, changes, text):
    numbers = json.loads((repo_root / "reports/labs/direct/smollm2-cuda-fp32.json").read_text())
    record = {k: v for k, v in numbers.items() if k not in ("held_out", "training", "device_run")}
    _, md = lab_report({**record, "rl": {**record["rl"], **changes}, "history": []})
    assert text in md and md.count("filler names") == int("p_rename_operands" in changes)


@pytest.mark.parametrize("cpu, text", [
    ({"isa": "AVX2", "numerics": "native", "env": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}},
     "bf16 flags: none, kernels AVX2 under native numerics (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2)), "),
    ({"isa": "AVX512", "numerics": "native", "env": {}}, "bf16 flags: none, kernels AVX512 under native numerics), "),
    ({}, "bf16 flags: none), ")])   # a record from before the kernels were kept reads as it did
def test_a_labs_report_names_the_kernels_its_cpu_ran(repo_root, cpu, text):
    numbers = json.loads((repo_root / "reports/labs/direct/smollm2-cuda-fp32.json").read_text())
    record = {k: v for k, v in numbers.items() if k not in ("held_out", "training", "device_run")}
    _, md = lab_report({**record, "cpu": {"model": "a CPU", "bf16_flags": [], **cpu}, "history": []})
    assert text in md and md.count("kernels") == (1 if cpu else 0)


@pytest.mark.parametrize("prefix_kv, named", [("once", True), ("repeat", False), (None, False)])
def test_a_labs_report_names_a_prefix_kept_once_only_where_set(repo_root, prefix_kv, named):
    """A lab sampled with the shared prefix kept once (another floating-point order than the committed seeds') says
    so in its first lines; `repeat`, and a record from before the key existed, read as they did."""
    numbers = json.loads((repo_root / "reports/labs/direct/smollm2-cuda-fp32.json").read_text())
    record = {k: v for k, v in numbers.items() if k not in ("held_out", "training", "device_run")}
    config = {k: v for k, v in record["config"].items() if k != "prefix_kv"}
    _, md = lab_report({**record, "config": {**config, **({"prefix_kv": prefix_kv} if prefix_kv else {})},
                        "history": []})
    assert ("dtype fp32, sampler's shared prompt prefix kept once (another floating-point order); CPU" in md) == named
    assert ("dtype fp32; CPU" in md) != named


def test_a_lab_verb_keeps_freed_memory_as_the_lab_stage_does(monkeypatch, capsys):
    """labtemps, labbaselines, ... time what the lab stage times: their process keeps freed memory too."""
    from agentrl import cli
    from agentrl.labs import allocator
    calls = []
    monkeypatch.setattr(allocator, "keep_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setitem(cli.LAB_VERBS, "labtemps", lambda args, set_threads: 0 if calls else 1)
    assert cli.main(["labtemps", "--lab", "menu", "--table"]) == 0 and calls == [1]


def test_a_lab_stopped_before_grpo_says_how_many_of_its_steps_ran(repo_root):
    from agentrl.labs.report import grpo_steps_text
    numbers = json.loads((repo_root / "reports/labs/direct/smollm2-cuda-fp32.json").read_text())
    record = {k: v for k, v in numbers.items() if k not in ("held_out", "training", "device_run")}
    assert "GRPO: 0 of 16 steps of 4 tasks x 8 episodes" in lab_report({**record, "history": []})[1]
    assert grpo_steps_text(record, 16) == "16 steps" and grpo_steps_text(record, 9) == "9 of 16 steps"


def test_the_committed_comparison_is_what_study_labs_writes_and_the_guide_quotes_it(repo_root, tmp_path, monkeypatch):
    """reports/labs/comparison.md is regenerated from the committed reports byte for byte, and docs/labs.md's seed
    table of the committed recipe is its table."""
    import shutil

    from agentrl import cli
    shutil.copytree(repo_root / "reports" / "labs", tmp_path / "reports" / "labs")
    shutil.copy(repo_root / "params.yaml", tmp_path / "params.yaml")   # the recipes' task sources
    monkeypatch.chdir(tmp_path)
    assert cli.main(["study", "labs"]) == 0
    for name in ("comparison.md", "comparison.json"):
        assert (tmp_path / "reports/labs" / name).read_text() == (repo_root / "reports/labs" / name).read_text(), name
    doc = (repo_root / "docs" / "labs.md").read_text()
    quoted = doc.split("<!-- study labs: smollm2 -->\n", 1)[1].split("<!-- end -->", 1)[0]
    assert quoted.count("\n") >= 5 and quoted in (repo_root / "reports/labs/comparison.md").read_text()
