"""The real-model labs (agentrl.labs): the lab section is validated like every other; the scripted expert's
conversation in Qwen3's template is what the policy would sample and read; and on the small Qwen3 after a cold start
the preflight gate holds: the nine invariants pass and every registered fault fails its own invariants. The
transformers tests are slow tier (a shortened config)."""
import json
from pathlib import Path

import pytest
import torch

from agentrl.core.config import ParamsError, load_section
from agentrl.env.gym.callers import call_tokens
from agentrl.starting.chat import call_arguments

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "data" / "tokenizers" / "qwen3"
needs_tokenizer = pytest.mark.usefixtures("qwen3_tokenizer")   # fails (not skips) without `make install`'s files


@pytest.mark.parametrize("values, message", [
    ({"device": "tpu"}, r"lab.device: unknown value 'tpu'; allowed: cpu, cuda"),
    ({"runs": ["menu", "chess"]}, r"lab.runs: unknown value 'chess'; allowed: menu, tools"),
    ({"configs": {"menu": {"episodes_per_task": 1}}}, r"lab.configs.menu.episodes_per_task: expected"),
    ({"configs": {"menu": {"new_tokens": 0}}}, r"lab.configs.menu.new_tokens: expected"),
    ({"configs": {"menu": {"colour": 1}}}, r"lab.configs.menu.colour: unknown key; allowed: base, environment, model"),
    ({"configs": {"a b": {}}}, r"lab.configs: 'a b': a lab name is letters, digits and _"),
    ({"configs": {"nl\n": {}}}, r"lab.configs: 'nl\\n': a lab name is letters, digits and _"),
    ({"colour": 1}, r"lab.colour: unknown key; allowed: runs, seeds, device, eval_batch, configs"),
    ({"seeds": [-1]}, r"lab.seeds: expected a non-empty list of distinct integers"),
    ({"configs": {"menu": {"seed": 3}}}, r"lab.configs.menu.seed: a seed is not part of a lab's config; run it with "
                                         r"--seed N \(python -m stages.lab\) or list it in lab.seeds"),
    ({"configs": {"menu": {}, "b": {"base": "nope"}}}, r"lab.configs.b.base: unknown value 'nope'; allowed: menu$"),
    ({"configs": {"a": {"base": "b"}, "b": {"base": "a"}}}, r"lab.configs.b.base: a is circular \(a -> b -> a\)"),
    ({"configs": {"a": {"base": "a"}}}, r"lab.configs.a.base: a is circular \(a -> a\)"),
    ({"configs": {"a": {"base": 3}}}, r"lab.configs.a.base: expected the name of another entry of lab.configs, "
                                      r"got 3"),
    ({"configs": {"a": {}, "b": {"base": "a", "steps": 0}}}, r"lab.configs.b.steps: expected an integer in"),
    ({"configs": {"a": {"steps": 0}, "b": {"base": "a"}}}, r"lab.configs.a.steps: expected an integer in"),
    ({"configs": {"menu": {"hidden": 1_000_000}}}, r"lab.configs.menu.hidden: expected an integer in \[8, 4096\]"),
    ({"configs": {"menu": {"steps": 10**21}}}, r"lab.configs.menu.steps: expected an integer in \[1, 100000\]"),
    ({"configs": {"menu": {"rl": {"p_rename_operands": 1.5}}}}, r"lab.configs.menu.rl.p_rename_operands: expected"),
    ({"configs": {"menu": {"prefix_kv": "twice"}}}, r"lab.configs.menu.prefix_kv: unknown value 'twice'; allowed: "
                                                    r"repeat, once$"),
    ({"configs": {"menu": {"temperatures": [0.5, 0]}}}, r"lab.configs.menu.temperatures: 0 is not a sampling "
                                                        r"temperature; allowed: numbers in \(0, 2\]$"),
    ({"configs": {"menu": {"temperatures": [0.5, 0.5]}}}, r"lab.configs.menu.temperatures: \[0.5, 0.5\] repeats"),
    ({"configs": {"menu": {"baselines": ["dpo"]}}}, r"lab.configs.menu.baselines: unknown value 'dpo'; allowed: "
                                                    r"more_cloning, more_cloning_tokens, rejection_sampling, "
                                                    r"rejection_sampling_grpo_lr$"),
    ({"configs": {"menu": {"baselines": ["more_cloning", "more_cloning"]}}}, r"lab.configs.menu.baselines: .* "
                                                                             r"repeats an arm; allowed: each once$"),
])
def test_a_bad_lab_value_is_one_line_naming_it(values, message):
    with pytest.raises(ParamsError, match=message) as err:
        load_section("lab", {"lab": values})
    assert "\n" not in str(err.value)


def test_a_random_init_model_larger_than_the_machine_is_refused_with_its_estimate(monkeypatch):
    from agentrl.core import lab_config
    monkeypatch.setattr(lab_config, "memory_bytes", lambda: 4 * 2**30)   # a 4 GiB machine
    with pytest.raises(ParamsError, match=r"lab.configs.menu.hidden: a random-init Qwen3 of hidden 2048 and 16 "
                                          r"layers needs about 5.\d GiB .*this machine has 4.0 GiB"):
        load_section("lab", {"lab": {"configs": {"menu": {"hidden": 2048, "layers": 16}}}})
    load_section("lab", {"lab": {"configs": {"menu": {"hidden": 256, "layers": 16}}}})   # 0.6 GiB: fits


def test_a_lab_is_a_config_entry():
    from agentrl.core.config import lab_run
    lab = load_section("lab", {"lab": {"configs": {"menu": {}, "mine": {"model": "x", "steps": 3}}, "runs": ["mine"]}})
    assert lab_run("mine", lab.configs["mine"]).steps == 3 and lab_run("menu", lab.configs["menu"]).steps == 25


def test_a_config_names_what_it_changes_over_its_base():
    """`base` takes the other entry's keys (its own base first), the entry's keys replace them, rl key by key."""
    from agentrl.core.lab_config import config_run, resolve
    configs = {"a": {"model": "m", "steps": 4, "rl": {"keep": "informative", "kl_coef": 0.1}},
               "b": {"base": "a", "steps": 8, "rl": {"kl_coef": 0.2}},
               "c": {"base": "b", "lr": 1.0e-5, "rl": {"p_rename_operands": 1.0}}}
    lab = load_section("lab", {"lab": {"configs": configs}})
    assert resolve(lab.configs, "c") == {"model": "m", "steps": 8, "lr": 1.0e-5,
                                         "rl": {"keep": "informative", "kl_coef": 0.2, "p_rename_operands": 1.0}}
    run = config_run(lab.configs, "c")
    assert (run.steps, run.lr, run.rl["kl_coef"]) == (8, 1.0e-5, 0.2) and config_run(lab.configs, "a").steps == 4


def test_the_committed_recipes_derive_from_smollm2(repo_root):
    """params.yaml keeps the committed recipes: smollm2 written out, the others naming what they change."""
    import agentrl.rl.variants  # noqa: F401  (the rl overrides name registered variants)
    from agentrl.core.config import load_params
    from agentrl.core.lab_config import config_run
    configs = load_params(["lab"], repo_root / "params.yaml")["lab"].configs
    assert set(configs) == {"menu", "tools", "smollm2", "smollm2_tools", "smollm2_book", "smollm2_book_bf16",
                            "smollm2_he_transfer", "smollm2_he", "smollm2_tools_he"}
    smollm2, tools = config_run(configs, "smollm2"), config_run(configs, "smollm2_tools")
    assert configs["smollm2_tools"]["base"] == "smollm2" and len(configs["smollm2_tools"]) <= 8
    assert (tools.clone_steps, tools.lr, tools.rl, tools.environment) == \
        (smollm2.clone_steps, smollm2.lr, smollm2.rl, "coding")
    assert config_run(configs, "smollm2_book_bf16").steps == 30 and config_run(configs, "smollm2_book").dtype == "fp32"
    # HumanEval: the recipes as they are (nothing retuned), held out on its test split
    for name, base, train in (("smollm2_he_transfer", smollm2, "authored"), ("smollm2_he", smollm2, "humaneval"),
                              ("smollm2_tools_he", tools, "humaneval")):
        he = config_run(configs, name)
        assert (he.tasks, he.eval_tasks, he.eval_split) == (train, "humaneval", "test"), name
        assert {**he.to_dict(), "tasks": "authored", "eval_tasks": "authored", "eval_split": "heldout"} == \
            base.to_dict(), name


def test_the_lab_is_outside_the_default_pipeline(repo_root):
    from agentrl.core.config import read_params_file
    assert read_params_file(repo_root / "params.yaml")["lab"]["runs"] == []


@pytest.mark.parametrize("call, expected", [(call_tokens("read"), ("read", {})),
                                            (call_tokens("edit", "fix_range"), ("edit", {"op": "fix_range"}))])
def test_the_gyms_call_words_become_tool_call_arguments(call, expected):
    assert call_arguments(call) == expected


@pytest.fixture(scope="module")
def chat():
    from agentrl.backends.hf import transformers
    from agentrl.env.gym.chat import GymToolChat
    return GymToolChat(transformers().AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True))


@pytest.mark.slow
@needs_tokenizer
def test_an_expert_demo_is_the_conversation_the_policy_would_sample(chat, train_tasks):
    """The demo's policy turns parse back to the expert's calls, the episode passes, and prompt + first turn are
    exactly the template's tokenized rendering of that conversation."""
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.rl.rollout import OWNER
    from agentrl.starting.chat import expert_demo
    env = make_env_factory(6, "hidden", True)(train_tasks[0], torch.Generator().manual_seed(0))
    demo = expert_demo(env, chat)
    assert demo.reward == 1.0 and demo.record.calls[0] == "read" and demo.record.finished
    turns, current = [], []
    for tid, owner in zip(demo.ids, demo.owner):
        if owner == OWNER["policy"]:
            current.append(tid)
            if tid == chat.stop_id:
                turns.append(current)
                current = []
    assert [chat.action(t)[1] for t in turns] == ["read", "edit", "test", "submit"]
    rendered = chat.encode(chat.render(chat.messages_for(env.name) + [chat.assistant_call("read", {})],
                                       generation_prompt=False))
    first = demo.owner.index(OWNER["env"])
    assert demo.ids[:first] == rendered[:first]


@pytest.fixture(scope="module")
def cloned_batch(chat, train_tasks, tmp_path_factory):
    """The small Qwen3 after a short cold start, and a first batch of two groups sampled from it."""
    from agentrl.backends.hf import make_small_model
    from agentrl.core.config import RLConfig
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.labs.recipe import probe_batch
    from agentrl.starting.chat import clone, expert_demos
    model = make_small_model(tmp_path_factory.mktemp("lab") / "m", torch.Generator().manual_seed(0), TOKENIZER)
    factory = make_env_factory(2, "hidden", True)
    g = torch.Generator().manual_seed(1)
    clone(model, expert_demos(train_tasks[:4], chat, factory, 1, g), chat, 3, 1e-2, 4, g)
    cfg = RLConfig(group_size=2, tasks_per_step=2, max_call_tokens=8, max_turns=2)
    trajs, _ = probe_batch(model, chat, train_tasks, cfg, factory, g)
    return model, trajs, cfg


@pytest.mark.slow
@needs_tokenizer
def test_the_fault_matrix_holds_on_the_small_qwen3_after_cold_start(cloned_batch, chat):
    from agentrl.faults.preflight import fault_matrix
    from agentrl.faults.registry import FAULTS
    model, trajs, cfg = cloned_batch
    out = fault_matrix(model, trajs, chat, cfg, list(FAULTS))
    assert out["failed"]["None"] == [], out["clean"]          # the nine invariants pass on the Qwen3 backend
    assert out["matches_expected"], (out["failed"], out["expected"])
    assert out["gate"] == "passed"


@pytest.fixture(scope="module")
def coding_chat():
    from agentrl.backends.hf import transformers
    from agentrl.env.coding.chat import CodingToolChat
    return CodingToolChat(transformers().AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True))


@pytest.mark.slow
@needs_tokenizer
def test_a_coding_turn_is_a_call_a_final_answer_or_malformed(coding_chat):
    """The start-up assertion held (fixture); a tool call is passed to the environment, a turn without one is the
    final answer, and broken JSON or two calls are malformed (the environment's check refuses them)."""
    from agentrl.env.coding.chat import MALFORMED_CALL
    from agentrl.env.coding.schemas import check_call
    ids = coding_chat.turn_ids("Read", {"file_path": "/repo/f.py"})
    assert coding_chat.action(ids) == ("call", {"name": "Read", "arguments": {"file_path": "/repo/f.py"}})
    assert coding_chat.action(coding_chat.answer_ids("Fixed it.")) == ("answer", "Fixed it.")
    broken = coding_chat.encode('<tool_call>\n{"name": "Read", "arguments": {\n</tool_call>') + [coding_chat.stop_id]
    two = ids[:-1] + ids
    for turn in (broken, two):
        kind, call = coding_chat.action(turn)
        assert kind == "call" and call is MALFORMED_CALL
        with pytest.raises(ValueError):
            check_call(call)


@pytest.mark.slow
@needs_tokenizer
def test_the_tools_expert_passes_through_the_template_and_the_sandbox(coding_chat, train_tasks):
    from agentrl.env.coding.chat import SandboxClock, make_chat_tools_env_factory
    from agentrl.starting.chat import tools_expert_demo
    clock = SandboxClock()
    env = make_chat_tools_env_factory(6, clock)(train_tasks[0], torch.Generator().manual_seed(0))
    demo = tools_expert_demo(env, coding_chat)
    record = demo.record
    assert demo.reward == 1.0 and record.calls == ("Read", "Edit", "Bash", "answer") and record.finished
    assert record.kinds == ("read", "edit", "test", "finish") and record.counts["tests"] == 1
    assert clock.runs == 2 and clock.seconds > 0   # pytest and the final grade
    from agentrl.env.coding.spec import CODING
    assert record.turns == 4 and set(record.counts) == set(CODING.counts)   # what it declares, no gym counter
    assert record.passed and record.facts == {"public_pass": True}


def test_a_wrong_lab_model_is_one_line_naming_it_before_anything_is_loaded(tmp_path):
    from agentrl.core.config import ConfigError, LabRun
    from agentrl.labs.recipe import load_policy
    with pytest.raises(ConfigError, match=r"^lab.model: .*nope is not a directory") as err:
        load_policy(LabRun(model=str(tmp_path / "nope")), 0, tmp_path / "unused")
    assert "\n" not in str(err.value) and not (tmp_path / "unused").exists()


SHORT = {"demos_per_task": 1, "clone_steps": 2, "clone_batch": 4, "steps": 1, "tasks_per_step": 2,
         "episodes_per_task": 2, "max_turns": 2, "new_tokens": 24, "eval_per_task": 1, "signal_tasks": 2,
         "min_signal": 0}   # a random-init model has no signal to gate on: the check reports, it does not stop
SHORT_LAB = {"eval_batch": 10,
             "configs": {"menu": SHORT, "tools": {**SHORT, "environment": "coding", "probe_group": 2}}}


@pytest.mark.slow
@needs_tokenizer
@pytest.mark.parametrize("name", ["menu", "tools"])
def test_a_lab_runs_end_to_end_on_a_shortened_config_and_reports_every_column(name, tmp_path, monkeypatch):
    """The whole lab (model made, written and loaded back; cold start; preflight; evaluation; GRPO; evaluation)
    on a shortened config, and its report has each of the issue's columns, filled. The menu lab's sampler keeps the
    shared prompt prefix once (LabRun.prefix_kv), the tools lab's copies it into every row: both paths end to end."""
    import json

    from agentrl.core.config import load_section
    from agentrl.labs.recipe import run_lab
    from agentrl.labs.report import lab_report
    from agentrl.labs.timing import SandboxShare
    monkeypatch.chdir(REPO)   # the tokenizer files under data/tokenizers/qwen3
    prefix_kv = "once" if name == "menu" else "repeat"
    configs = {**SHORT_LAB["configs"], name: {**SHORT_LAB["configs"][name], "prefix_kv": prefix_kv}}
    lab = {**SHORT_LAB, "configs": configs}
    params = {"lab": load_section("lab", {"lab": lab}), "rl": load_section("rl", {"rl": {}}),
              "run": load_section("run", {"run": {}})}
    share = SandboxShare()
    from agentrl.core.lab_config import config_run
    record = run_lab(name, config_run(params["lab"].configs, name), 0, params, tmp_path / "out", tmp_path / "model",
                     log=lambda *_: None, hooks=[share], clock=share.clock)
    record["threads"] = 2
    if name == "tools":
        record["sandbox"] = share.summary()
    numbers, md = lab_report(record)
    assert (tmp_path / "model" / "config.json").is_file() and (tmp_path / "out" / "final" / "tokenizer.json").is_file()
    assert numbers["held_out"]["tasks"] == 10 and len(numbers["training"]["entropy_per_step"]) == 1
    assert numbers["config"]["prefix_kv"] == prefix_kv and ("shared prompt prefix kept once" in md) == (name == "menu")
    assert set(numbers["preflight"]["checks"]) == {"mask_is_policy", "sampler_trainer_gap", "ratio_is_one",
                                                   "group_adv_mean", "padding_invariance", "accumulation",
                                                   "old_logp_frozen", "update_direction", "kl_to_reference"}
    columns = ["paired", "share that Read first" if name == "tools" else "share that read first",
               "action-token entropy per step", "zero-advantage share", "sampler-trainer gap", "Wall time",
               "Peak memory", "| task |", "mechanism demonstration"]
    columns += ["failed calls per episode, by kind", "Write calls", "test runs", "claiming success",
                "| family", "sandbox share of a training step"] if name == "tools" else \
        ["malformed calls", "share that submit"]
    for column in columns:
        assert column in md, column
    assert "n/a" not in md.split("## Preflight")[0] or not record["weights_changed"], md
    if not record["weights_changed"]:   # no step changed a weight: said in one line, and no after-GRPO column
        assert "**No GRPO step changed a weight**" in md and "| after GRPO |" not in md
    work = numbers["floors"]   # each phase beside the floor of the operations it ran (agentrl.model.floors)
    assert {"cold_start", "preflight", "eval_before", "grpo"} <= set(work["phases"])
    for what, w in work["phases"].items():
        assert w["floor_s"] > 0 and w["operations"] > 0 and w["seconds"] == record["timings_s"][what], what
        assert f"| {what} | {w['seconds']:.1f} | {w['floor_s']:.1f} |" in md
    import torch
    assert numbers["cpu"]["isa"] == torch.backends.cpu.get_cpu_capability()   # the kernels it ran, named
    assert f"kernels {numbers['cpu']['isa']} under {numbers['cpu']['numerics']} numerics" in md
    json.dumps(numbers)   # the report's numbers are JSON


@pytest.mark.slow
@needs_tokenizer
def test_the_hf_bench_measures_both_samplers_and_both_update_memories():
    """`bench --backend hf` on a tiny setting: both samplers drew the same number of new tokens (asserted inside)
    and the update with full logits needs more memory than the one with the LM head on policy positions."""
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "agentrl", "bench", "--backend", "hf", "--rows", "2",
                          "--new-tokens", "3", "--steps", "1", "--memory-rows", "2", "--clone-rows", "2", "--threads",
                          "1", "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    s, mem = result["sampling"], result["memory"]
    assert s["backend_s_per_token"] > 0 and s["generate_s_per_token"] > 0 and s["new_tokens"] == 3
    assert mem["policy"]["policy_tokens"] == mem["full"]["policy_tokens"] > 0
    assert mem["full"]["peak_above_mib"] > 2 * mem["policy"]["peak_above_mib"]
    assert result["cpu"]["onednn_cap"] == "AVX2"   # params.yaml's portable numerics, recorded beside the flags
    floors = result["fp32"]["floors"]   # each phase beside its floor, from the same run's bandwidth and GEMM
    assert [f["phase"].split(",")[0] for f in floors] == ["decode step", "update pass", "cloning step"]
    assert all(f["floor_s"] == max(f["memory_s"], f["compute_s"]) > 0 and f["ratio"] == f["seconds"] / f["floor_s"]
               for f in floors)
    assert "| phase | time (ms) | floor (ms) | bound by |" in out.stdout


@pytest.mark.slow
@needs_tokenizer
def test_the_decode_only_bench_compares_the_prefix_modes_at_equal_arithmetic():
    """`bench --backend hf --decode-only --prefix-kv repeat,once --json`: each row count in both modes, the same
    FLOPs, fewer bytes read once the shared prefix is kept once, the sampler-trainer gap as small in both."""
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "agentrl", "bench", "--backend", "hf", "--rows", "2,4",
                          "--new-tokens", "3", "--steps", "1", "--threads", "1", "--decode-only",
                          "--prefix-kv", "repeat,once", "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    decode = result["fp32"]["decode"]
    assert [(d["rows"], d["prefix_kv"]) for d in decode] == [(2, "repeat"), (2, "once"), (4, "repeat"), (4, "once")]
    assert all(d["shared"] == 0 for d in decode if d["prefix_kv"] == "repeat")
    assert all(0 < d["shared"] < d["prompt_tokens"] for d in decode if d["prefix_kv"] == "once")
    assert all(d["gap_max"] < 1e-4 for d in decode)
    floors = result["fp32"]["floors"]
    for repeat, once in zip(floors[0::2], floors[1::2]):
        assert "kept once" in once["phase"] and once["gflop"] == repeat["gflop"] and once["gbytes"] < repeat["gbytes"]
    assert "sampling" not in result   # no sampler-against-generate comparison was run


@pytest.mark.slow
def test_the_isa_caps_bench_runs_each_cap_in_its_own_process_with_its_kernels():
    """Each cap's child dispatched what its variables asked (torch's ISA at AVX2 under the AVX2 and portable caps)
    and measured both dtypes; the caps come from the bench's table, not from this process's pin."""
    import json
    import subprocess
    import sys

    from agentrl.bench.caps import CAPS, child_env
    from agentrl.core.numerics import cpu_info
    out = subprocess.run([sys.executable, "-m", "agentrl", "bench", "--backend", "hf", "--isa-caps", "--threads", "1",
                          "--json"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert list(result["caps"]) == list(CAPS) and result["shape"] == [2048, 64, 192]
    assert result["caps"]["avx2"]["isa"] == result["caps"]["portable"]["isa"] == "AVX2"
    assert result["caps"]["uncapped"]["isa"] == ("AVX512" if cpu_info()["avx512"] else "AVX2")
    assert all(r["fp32"] > 0 and r["bf16"] > 0 for r in result["caps"].values())
    assert "ONEDNN_MAX_CPU_ISA" not in child_env({}) and child_env({"X_CAP": "1"})["X_CAP"] == "1"


def test_the_hf_bench_refuses_bf16_under_portable_numerics_in_one_line_before_loading():
    """Whatever the CPU: without bf16 flags the flags refuse it, with them portable's oneDNN cap at AVX2 does."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "agentrl", "bench", "--backend", "hf", "--dtype", "bf16",
                          "--numerics", "portable", "--rows", "2", "--threads", "1"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 2 and out.stdout == "", (out.stdout, out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1 and "error: --dtype: bf16 needs " in out.stderr
    assert "allowed here: fp32" in out.stderr


def test_a_cuda_lab_on_a_machine_without_one_is_one_line_before_anything_is_made(tmp_path):
    from agentrl.core.config import ConfigError, lab_run, load_section
    from agentrl.labs.recipe import run_lab
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: lab.device cuda is valid here")
    params = {"lab": load_section("lab", {"lab": {"device": "cuda"}}), "rl": load_section("rl", {"rl": {}}),
              "run": load_section("run", {"run": {}})}
    with pytest.raises(ConfigError, match=r"^lab.device: cuda, but torch sees no CUDA device") as err:
        run_lab("menu", lab_run("menu", {}), 0, params, tmp_path / "out", tmp_path / "model")
    assert "\n" not in str(err.value) and not (tmp_path / "model").exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
@needs_tokenizer
def test_labcheck_on_the_cpu_passes_and_reports_its_memory():
    """`labcheck --device cpu`: the command a GPU machine runs with --device cuda (one cold-start step, the nine
    invariants, two GRPO steps)."""
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "agentrl", "labcheck", "--device", "cpu", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["passed"] and result["grpo_steps"] == 2 and result["device"] == "cpu"
    assert all(c["passed"] for c in result["invariants"].values()) and len(result["invariants"]) == 9
    assert result["peak_memory_mib"] > 0 and result["peak_device_memory_mib"] is None


def test_every_random_draw_is_made_on_its_generators_device(monkeypatch):
    """The draws a lab makes go to the generator's device, whatever the default device: a CUDA run's CPU
    generators never meet a CUDA tensor (here the default device is faked by a spy on every draw's device)."""
    from agentrl.env.gym.environment import randomize_names
    from agentrl.model.logprobs import draw
    from agentrl.rl.rollout import choose_tasks, choose_weighted_tasks
    seen = []
    real = {name: getattr(torch, name) for name in ("randint", "randperm", "multinomial")}

    def spy(name):
        def call(*args, **kwargs):
            gen = kwargs.get("generator")
            dev = kwargs.get("device", next((a.device for a in args if torch.is_tensor(a)), None))
            seen.append((name, str(dev), str(gen.device)))
            return real[name](*args, **kwargs)
        return call
    for name in real:
        monkeypatch.setattr(torch, name, spy(name))
    g = torch.Generator().manual_seed(0)
    randomize_names(g)
    choose_tasks(list(range(5)), 3, g)
    choose_weighted_tasks(list(range(5)), 3, [1.0] * 5, g)
    draw(torch.randn(2, 8), g)
    assert {n for n, _, _ in seen} == {"randint", "randperm", "multinomial"}
    assert all(dev == gen for _, dev, gen in seen), seen


def _probe_with_rewards(monkeypatch, rewards_of: dict, tries: int = 3):
    """probe_batch on a fake sampler whose episode on task `name` gets the next of rewards_of[name]; returns the
    batch, its note, and the tasks sampled in order."""
    from types import SimpleNamespace

    from agentrl.core.config import RLConfig
    from agentrl.labs import recipe
    played, left = [], {name: list(r) for name, r in rewards_of.items()}

    def sample(model, envs, chat, generator, temperature, max_tokens):
        played.extend(envs)
        return [SimpleNamespace(task=name, reward=left[name].pop(0)) for name in envs]
    monkeypatch.setattr(recipe, "sample_episodes", sample)
    tasks = [SimpleNamespace(name=name) for name in rewards_of]
    trajs, note = recipe.probe_batch(None, None, tasks, RLConfig(group_size=2), lambda task, g: task.name,
                                     torch.Generator().manual_seed(0), tries=tries)
    return trajs, note, played


def test_the_probe_batch_moves_on_until_a_group_disagrees(monkeypatch):
    """Check 8 needs a group whose sampled rewards disagree: a pair of tasks whose every episode passed, or whose
    groups differ only from each other (all advantages 0), is passed over for the next pair, on the same stream."""
    trajs, note, played = _probe_with_rewards(monkeypatch, {
        "a": [1, 1], "b": [1, 1],        # every episode passed: no signal
        "c": [1, 1], "d": [0, 0],        # the rewards differ, but only between the groups: still no advantage
        "e": [0, 0], "f": [1, 0],        # f's group disagrees
        "g": [1, 0], "h": [1, 0]})
    assert played == ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e", "f", "f"]
    assert [(t.task, t.reward, t.group) for t in trajs] == [("e", 0, 0), ("e", 0, 0), ("f", 1, 1), ("f", 0, 1)]
    assert note.startswith("sampled (tasks e, f: the 2 pair(s) before")


def test_the_probe_batch_alternates_rewards_only_when_no_pair_disagrees(monkeypatch):
    trajs, note, played = _probe_with_rewards(monkeypatch, {name: [1, 1] for name in "abcdef"}, tries=2)
    assert played == ["a", "a", "b", "b", "c", "c", "d", "d"]      # two pairs tried, no more
    assert [t.reward for t in trajs] == [1.0, 0.0, 1.0, 0.0] and [t.task for t in trajs] == ["c", "c", "d", "d"]
    assert note.startswith("alternating 1/0") and "2 pairs" in note
    _, note, played = _probe_with_rewards(monkeypatch, {"a": [1, 0], "b": [1, 1]})
    assert note == "sampled" and played == ["a", "a", "b", "b"]


def _lab_numbers(changed: bool, pretrained: bool) -> dict:
    ci = {"mean": 0.25, "lo": 0.1, "hi": 0.4}
    held = {"before": ci, "after": {"mean": 0.5, "lo": 0.3, "hi": 0.7}, "gain": {"mean": 0.25, "lo": 0.05, "hi": 0.45}}
    if pretrained:
        held["pretrained"] = {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    return {"model": "M", "parameters": 10, "weights_changed": changed, "held_out": held,
            "training": {"entropy_per_step": [0.5, 0.1], "zero_adv_share": 0.4},
            "before": {"malformed": 1.0}, "after": {"malformed": 0.0}}


def test_the_labs_study_puts_the_committed_recipes_first_and_the_explored_apart(tmp_path, monkeypatch, capsys):
    from agentrl import cli
    monkeypatch.chdir(tmp_path)
    assert cli.main(["study", "labs"]) == 2   # nothing to compare: one line
    assert "no lab reports" in capsys.readouterr().err
    labs = tmp_path / "reports" / "labs"
    for where, changed, pretrained in (("smol", True, True), ("menu", False, False), ("explored/old", True, False),
                                       ("explored/he", True, False)):
        (labs / where).mkdir(parents=True)
        numbers = _lab_numbers(changed, pretrained)
        if where == "explored/he":   # held out on other tasks: its row says so, not comparable to the authored rows
            numbers["config"] = {**numbers.get("config", {}), "tasks": "humaneval", "eval_tasks": "humaneval",
                                 "eval_split": "test"}
        (labs / where / "seed0.json").write_text(json.dumps(numbers))
    (labs / "smol" / "seed0.probe.json").write_text("{}")   # a recipe's other files are not seeds
    assert cli.main(["study", "labs"]) == 0
    md = (labs / "comparison.md").read_text()
    committed, explored = md.split("## Explored recipes")
    rows = [line for line in committed.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| the book, section 19.7 | Qwen3-0.6B | n/a | 0.20 [0.06, 0.39] | 0.80 [0.50, 1.00]")
    menu, smol = rows[2], rows[3]
    assert menu.startswith("| `menu` seed 0 | M | n/a | 0.250 [0.100, 0.400] | (= after the cold start) | "
                           "no weight changed")
    assert smol.startswith("| `smol` seed 0 | M | 0.000 [0.000, 0.000] (no episode succeeded) | "
                           "0.250 [0.100, 0.400] | 0.500 [0.300, 0.700] | +0.250 [+0.050, +0.450] | n/a | "
                           "1.00 -> 0.00 | 0.500 -> 0.100 | 0.400 |")
    assert "| `old` seed 0 | " in explored and "`old`" not in committed and "the book" not in explored
    assert "| `he` seed 0 (trained on humaneval, held out on humaneval test) | " in explored
    numbers = json.loads((labs / "comparison.json").read_text())
    assert set(numbers["recipes"]) == {"smol", "menu"} and set(numbers["explored"]) == {"old", "he"}
    assert numbers["book_qwen3_0_6b"]["gain"] == "+0.60 [+0.33, +0.88]"


def test_a_labs_training_episodes_rename_operands_and_its_evaluations_never():
    """rl.p_rename_operands reaches the lab's training episodes (cold start, signal check, preflight, GRPO) and not
    its held-out evaluation or the op probe, which read the authored sources whatever the lab trains on."""
    from agentrl.core.config import lab_run
    from agentrl.env.tasks import make_tasks
    from agentrl.labs.recipe import env_factory_for
    run = lab_run("menu", {"rl": {"p_rename_operands": 1.0}})
    training, evaluation = env_factory_for(run), env_factory_for(run, evaluation=True)
    gen = torch.Generator().manual_seed(0)
    assert all(training(task, gen).operands for task in make_tasks("train"))
    assert all(evaluation(task, gen).operands is None for task in make_tasks("all"))
    plain = env_factory_for(lab_run("menu", {}))
    assert all(plain(task, gen).operands is None for task in make_tasks("train"))
    tools = lab_run("tools", {"environment": "coding", "rl": {"p_rename_operands": 1.0}})
    training, evaluation = env_factory_for(tools), env_factory_for(tools, evaluation=True)
    assert all(training(task, gen).env.operands for task in make_tasks("train"))
    assert all(evaluation(task, gen).env.operands is None for task in make_tasks("all"))
