"""What a lab needs to learn on a real model and to show where it stopped exploring: per-lab rl overrides validated as
rl: is, a bf16 dtype refused where the CPU would only emulate it, the sampler's entropy at the tokens that decide a
call, the signal summaries, an update bounded by its KL, no update on a step without a gradient, and the
preflight's update direction measured at the config's own KL. The transformers tests are slow tier."""
from pathlib import Path

import pytest
import torch

from agentrl.core.config import ConfigError, lab_run

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "data" / "tokenizers" / "qwen3"


# ---------------------------------------------------------------- config

@pytest.mark.parametrize("spec, message", [
    ({"rl": {"keep": "sometimes"}}, r"LabConfig.configs.x.rl.keep: unknown value 'sometimes'; allowed: all, "),
    ({"rl": {"temperature": 0}}, r"LabConfig.configs.x.rl.temperature: expected a finite number > 0"),
    ({"rl": {"lr": 1e-6}}, r"LabConfig.configs.x.rl.lr: set by the lab's own fields"),
    ({"rl": {"kepp": "all"}}, r"LabConfig.configs.x.rl.kepp: unknown key; allowed: epochs, "),
    ({"rl": ["keep"]}, r"LabConfig.configs.x.rl: expected a mapping"),
    ({"dtype": "fp16"}, r"LabConfig.configs.x.dtype: unknown value 'fp16'; allowed: fp32, bf16"),
    ({"demos": "oracle"}, r"LabConfig.configs.x.demos: unknown value 'oracle'; allowed: expert, format"),
    ({"max_kl": 0}, r"LabConfig.configs.x.max_kl: expected a finite number > 0"),
    ({"min_signal": 1.5}, r"LabConfig.configs.x.min_signal: expected a finite number in \[0, 1\], got 1.5"),
])
def test_a_bad_lab_rl_override_or_knob_is_one_line_naming_it(spec, message):
    import agentrl.rl.trainer  # noqa: F401  (registers the rl variants whose names the knobs allow)
    with pytest.raises(ConfigError, match=message):
        lab_run("x", spec)


def test_lab_rl_overrides_reach_the_grpo_config_and_the_labs_own_fields_win():
    import agentrl.rl.trainer  # noqa: F401
    from agentrl.core.config import RLConfig
    from agentrl.labs.recipe import rl_config
    run = lab_run("x", {"lr": 2e-6, "episodes_per_task": 8, "rl": {"keep": "informative", "lr_warmup": 3,
                                                                    "temperature": 0.9}})
    cfg = rl_config(RLConfig(), run, 0)
    assert (cfg.keep, cfg.lr_warmup, cfg.temperature, cfg.lr, cfg.group_size) == ("informative", 3, 0.9, 2e-6, 8)


@pytest.mark.parametrize("flags, ok", [({"avx512f", "avx2"}, False), ({"avx512f", "avx512_bf16"}, True),
                                       ({"amx_tile", "amx_bf16"}, True), (set(), False)])
def test_bf16_is_refused_on_a_cpu_without_bf16_products_naming_the_flags(flags, ok):
    from agentrl.labs.precision import check_dtype
    check_dtype("fp32", "cpu", "LabConfig.configs.x.dtype", flags=set())   # fp32 runs anywhere
    if ok:
        check_dtype("bf16", "cpu", "LabConfig.configs.x.dtype", flags=flags, environ={})
    else:
        with pytest.raises(ConfigError, match=r"^LabConfig.configs.x.dtype: bf16 needs a CPU flag amx_bf16 or "
                                              r"avx512_bf16; this CPU \(.*\) has neither .* allowed here: fp32$"):
            check_dtype("bf16", "cpu", "LabConfig.configs.x.dtype", flags=flags, environ={})


@pytest.mark.parametrize("environ, refused", [
    ({"ONEDNN_MAX_CPU_ISA": "AVX2", "AGENTRL_NUMERICS": "portable"}, "portable numerics cap oneDNN at AVX2"),
    ({"DNNL_MAX_CPU_ISA": "avx512_core", "AGENTRL_NUMERICS": "native"}, "the environment's .* caps oneDNN at "
                                                                       "AVX512_CORE"),
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, "the environment.s .* caps oneDNN at AVX512_CORE_VNNI"),
    ({"ONEDNN_MAX_CPU_ISA": "ALL", "DNNL_MAX_CPU_ISA": "AVX2"}, None),   # oneDNN reads its own name first
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, None), ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, None),
    ({"ONEDNN_MAX_CPU_ISA": ""}, None), ({"AGENTRL_NUMERICS": "native"}, None)])
def test_bf16_is_refused_where_onednn_is_capped_below_its_bf16_kernels(environ, refused):
    """A CPU with bf16 products, but oneDNN capped below them (portable numerics set AVX2): torch's bf16 matmuls
    would be emulated (2 GFLOP/s against fp32's 162 on the AMX Xeon, docs/performance.md), so bf16 is refused."""
    from agentrl.labs.precision import check_dtype
    amx = {"amx_tile", "amx_bf16", "avx512_bf16"}
    check_dtype("fp32", "cpu", "LabConfig.configs.x.dtype", flags=amx, environ=environ)
    if refused is None:
        check_dtype("bf16", "cpu", "LabConfig.configs.x.dtype", flags=amx, environ=environ)
    else:
        with pytest.raises(ConfigError, match=rf"^LabConfig.configs.x.dtype: bf16 needs native numerics with oneDNN "
                                              rf"uncapped: {refused}, .*allowed here: fp32, or bf16 under numerics: "
                                              r"native$"):
            check_dtype("bf16", "cpu", "LabConfig.configs.x.dtype", flags=amx, environ=environ)


def test_a_bf16_lab_that_sets_portable_numerics_is_refused_with_the_params():
    from agentrl.core.config import load_section
    from agentrl.core.knobs import ParamsError
    from agentrl.core.lab_config import lab_run
    assert lab_run("b", {"dtype": "bf16", "numerics": "native"}).dtype == "bf16"
    assert lab_run("b", {"dtype": "fp32", "numerics": "portable"}).numerics == "portable"
    with pytest.raises(ConfigError, match=r"^LabConfig.configs.b.dtype: bf16 needs numerics: native \(portable "
                                          r"numerics cap oneDNN at AVX2, .*allowed with portable: fp32$"):
        lab_run("b", {"dtype": "bf16", "numerics": "portable"})
    with pytest.raises(ParamsError, match=r"^params.yaml: lab.configs.b.dtype: bf16 needs numerics: native"):
        load_section("lab", {"lab": {"configs": {"b": {"dtype": "bf16", "numerics": "portable"}}}})


def test_a_bf16_lab_on_a_cpu_without_it_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """run_lab checks the dtype before load_policy is ever called."""
    from agentrl.core.config import lab_run, load_section
    from agentrl.labs import precision, recipe
    monkeypatch.setattr(precision, "cpu_info", lambda: {"model": "a CPU without bf16", "flags": {"avx2"}})
    monkeypatch.setattr(recipe, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    params = {"lab": load_section("lab", {"lab": {"configs": {"b": {"dtype": "bf16"}}}}),
              "rl": load_section("rl", {"rl": {}}), "run": load_section("run", {"run": {}})}
    with pytest.raises(ConfigError, match=r"LabConfig.configs.b.dtype: bf16 needs .*a CPU without bf16"):
        recipe.run_lab("b", lab_run("b", {"dtype": "bf16"}), 0, params, tmp_path / "out", tmp_path / "model",
                       log=lambda *_: None)
    assert not (tmp_path / "out").exists()


def test_a_bf16_lab_under_portable_numerics_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """A lab that leaves numerics to run.numerics (portable): the AMX CPU has bf16 products, the pin capped oneDNN
    at AVX2, and run_lab refuses before load_policy."""
    from agentrl.core.config import lab_run, load_section
    from agentrl.labs import precision, recipe
    monkeypatch.setattr(precision, "cpu_info", lambda: {"model": "an AMX CPU", "flags": {"amx_bf16", "amx_tile"}})
    monkeypatch.setattr(recipe, "load_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.setenv("AGENTRL_NUMERICS", "portable")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    params = {"lab": load_section("lab", {"lab": {"configs": {"b": {"dtype": "bf16"}}}}),
              "rl": load_section("rl", {"rl": {}}), "run": load_section("run", {"run": {}})}
    with pytest.raises(ConfigError, match=r"LabConfig.configs.b.dtype: bf16 needs native numerics with oneDNN "
                                          r"uncapped: portable numerics cap oneDNN at AVX2"):
        recipe.run_lab("b", lab_run("b", {"dtype": "bf16"}), 0, params, tmp_path / "out", tmp_path / "model",
                       log=lambda *_: None)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the sampler's entropy and the signal summaries

@pytest.mark.parametrize("vocab", [50, 6000])
def test_draw_returns_the_entropy_of_the_distribution_it_drew_from(vocab):
    """Both of draw's paths (small and large vocabularies): the entropy equals the definition's, and asking for it
    changes neither the token nor its log-prob."""
    from agentrl.model.logprobs import draw
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0)) * 3
    token, logp, entropy = draw(logits, torch.Generator().manual_seed(1), entropy=True)
    token2, logp2 = draw(logits, torch.Generator().manual_seed(1))
    p = torch.softmax(logits.double(), -1)
    assert torch.equal(token, token2) and torch.equal(logp, logp2)
    assert torch.allclose(entropy.double(), -(p * p.log()).sum(-1), atol=1e-5)


def _traj(group, reward, decisions, family="range"):
    from agentrl.env.base import EpisodeRecord
    from agentrl.rl.rollout import Trajectory
    record = EpisodeRecord(task=f"{family}/t", family=family, name="f", turns=1, malformed=0, finished=True,
                           passed=reward > 0, counts={"reads": 0, "tests": 0, "edits": 0, "hardcode": 0})
    return Trajectory([1, 2, 3], [0, 1, 1], [0.0, -0.1], reward, record, group=group, decisions=decisions)


def test_decision_entropy_informative_share_and_families_from_episodes():
    from agentrl.labs.signal import decision_entropy, informative_share, per_family
    trajs = [_traj(0, 1.0, [{"name": 0.5}, {"name": 0.1, "op": 1.5}]), _traj(0, 0.0, [{"name": 0.3}, {}]),
             _traj(1, 0.0, [{"name": 0.1, "op": 0.1}], family="zero"), _traj(1, 0.0, [], family="zero")]
    d = decision_entropy(trajs)
    assert d["call"] == pytest.approx((0.5 + 1.6 + 0.3 + 0.2) / 4)   # a call's keys summed; calls with none skipped
    assert d["name"] == pytest.approx((0.5 + 0.1 + 0.3 + 0.1) / 4) and d["op"] == pytest.approx((1.5 + 0.1) / 2)
    assert informative_share(trajs) == 0.5
    assert per_family(trajs) == {"range": [1, 2], "zero": [0, 2]}


# ---------------------------------------------------------------- the update: a KL bound, no step without a gradient

def _batch(tok, trajs, cfg):
    from agentrl.rl.trainer import prepare_batch
    return prepare_batch(trajs, tok, cfg)


@pytest.fixture(scope="module")
def sampled(quick_base, tok, train_tasks):
    import agentrl.rl.trainer  # noqa: F401
    from agentrl.core.config import RLConfig
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.rl.rollout import sample_groups
    cfg = RLConfig(group_size=4, tasks_per_step=4, minibatches=4)
    trajs = sample_groups(quick_base, make_env_factory(6, "hidden", True), train_tasks[:4], tok, cfg,
                          torch.Generator().manual_seed(0))
    for i, t in enumerate(trajs):   # a signal in every group (the quick base rarely passes)
        t.reward = float(i % 2)
    return cfg, trajs


def test_a_kl_bound_stops_the_update_before_the_step_that_would_exceed_it(quick_base, tok, sampled):
    import copy
    from dataclasses import replace

    from agentrl.rl.trainer import make_optimizer, rl_update
    cfg, trajs = sampled
    cfg = replace(cfg, lr=3e-2)
    unbounded = rl_update(copy.deepcopy(quick_base), make_optimizer(quick_base, cfg), _batch(tok, trajs, cfg),
                          cfg, max_kl=1e9)
    assert unbounded["kl_stopped"] == 0 and unbounded["optimizer_steps"] == 4
    model = copy.deepcopy(quick_base)
    bounded = rl_update(model, make_optimizer(model, cfg), _batch(tok, trajs, cfg), cfg, max_kl=1e-12)
    # minibatch 0 is measured before any step (KL 0), so it steps; minibatch 1 sees the moved policy and stops
    assert bounded["kl_stopped"] == 1 and bounded["optimizer_steps"] == 1
    plain = rl_update(copy.deepcopy(quick_base), make_optimizer(quick_base, cfg), _batch(tok, trajs, cfg), cfg)
    assert "kl_stopped" not in plain and "optimizer_steps" not in plain   # the pipeline's rows are unchanged


def test_a_step_without_a_gradient_makes_no_update_so_adam_does_not_drift(quick_base, tok, train_tasks):
    """Step 0 with non-zero advantages, step 1 with every advantage 0 and no KL or entropy term: without skip_empty
    Adam steps on its momentum alone and moves the weights (the drift measured in the labs); with it, step 1 makes
    no update and the weights stay bit-identical."""
    import copy
    from dataclasses import replace

    from agentrl.core.config import RLConfig
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.rl import trainer
    cfg = RLConfig(group_size=4, tasks_per_step=2, lr=1e-3)
    factory = make_env_factory(6, "hidden", True)

    def run(skip):
        calls = []

        def advantages(batch, c):   # +1/-1 at step 0 (the quick base rarely passes), 0 after
            calls.append(1)
            adv = torch.tensor([1.0, -1.0]).repeat(batch["rewards"].shape[0] // 2)
            return adv if len(calls) == 1 else torch.zeros_like(adv)
        seams = replace(trainer.SEAMS, advantages=advantages)
        model, after_first = copy.deepcopy(quick_base), []

        class Snapshot(trainer.Hook):
            def after_step(self, updates, state):
                if updates == 1:
                    after_first.extend(p.detach().clone() for p in state.model.parameters())
        history = trainer.train(model, train_tasks[4:8], tok, cfg, 2, env=factory, seams=seams,
                                generator=torch.Generator().manual_seed(3), hooks=[Snapshot()], skip_empty=skip)
        moved = any(not torch.equal(a, b) for a, b in zip(after_first, model.parameters()))
        return moved, history
    drifted, history = run(skip=False)
    assert history[0]["grad_norm"] > 0 and history[1]["grad_norm"] == 0 and drifted
    still, history = run(skip=True)
    assert history[0]["grad_norm"] > 0 and "grad_norm" not in history[1] and not still


# ---------------------------------------------------------------- the Hugging Face sampler (slow: transformers)

needs_tokenizer = pytest.mark.usefixtures("qwen3_tokenizer")


@pytest.fixture(scope="module")
def small_qwen3(tmp_path_factory):
    from agentrl.backends.hf import make_small_model
    return make_small_model(tmp_path_factory.mktemp("q3") / "model", torch.Generator().manual_seed(0), TOKENIZER)


@pytest.fixture(scope="module")
def gym_chat():
    from agentrl.backends.hf import transformers
    from agentrl.env.gym.chat import GymToolChat
    return GymToolChat(transformers().AutoTokenizer.from_pretrained(TOKENIZER))


def _decode_steps(model, prompts, steps, cache_factory=None):
    """Logits of a sampler fed `prompts` then `steps` fixed tokens (rows 1 leaves after 2 steps)."""
    from agentrl.backends import hf_sampler
    sampler = model.sampler(151643)
    if cache_factory is not None:
        sampler.cache = cache_factory(model.lm.config)
    with torch.inference_mode():
        out = [sampler.append(prompts)]
        rows = len(prompts)
        for k in range(steps):
            if k == 2:
                sampler.keep(torch.tensor([0, 2]))
                rows = 2
            out.append(sampler.step(torch.full((rows, 1), 1000 + k), torch.ones(rows, dtype=torch.bool)))
    return out, hf_sampler


@pytest.mark.slow
@needs_tokenizer
def test_the_kv_slab_gives_the_logits_of_transformers_own_cache(small_qwen3):
    """The slab (written in place, grown, rows repeated and dropped) against transformers' DynamicCache, which
    concatenates: the same logits at every step, bit for bit."""
    from transformers import DynamicCache
    prompts = [list(range(500, 530)) + [7000 + n] * n for n in (3, 40, 9)]   # a shared prefix, then rows that differ
    slab, _ = _decode_steps(small_qwen3, prompts, 70)   # 70 steps: past the slab's first capacity
    plain, _ = _decode_steps(small_qwen3, prompts, 70, lambda config: DynamicCache(config=config))
    assert all(torch.equal(a, b) for a, b in zip(slab, plain))


@pytest.mark.slow
@needs_tokenizer
def test_the_samplers_weight_copy_follows_every_optimizer_step(small_qwen3):
    """After an Adam step the sampler decodes from the new weights (its copy refreshed from the parameters'
    versions), so it agrees with the trainer's pass; a stale copy would not."""
    import copy
    model = copy.deepcopy(small_qwen3)
    ids = torch.tensor([list(range(500, 540))])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.log_probs(ids)[0].sum().backward()
    with torch.inference_mode():
        stale = model.sampler(151643).append([ids[0].tolist()])
    opt.step()
    with torch.inference_mode():
        fresh = model.sampler(151643).append([ids[0].tolist()])
        full = model.logits(ids)[0, -1]
    assert float((fresh[0] - full).abs().max()) < 1e-4 < float((stale[0] - full).abs().max())


@pytest.mark.slow
@needs_tokenizer
def test_bf16_mixed_precision_keeps_fp32_masters_and_a_measured_gap(small_qwen3, gym_chat, train_tasks):
    """bf16 (emulated where the CPU lacks it: this test checks numbers, not speed): the master weights and their
    gradients stay fp32, the sampler decodes from a bf16 copy, and the sampler-trainer gap is a measured, small,
    non-zero number (the book's bf16 lesson), where fp32's is below 1e-5."""
    import copy

    from agentrl.core.config import RLConfig
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.rl.rollout import sample_groups
    from agentrl.rl.trainer import pre_update_pass, prepare_batch
    cfg = RLConfig(group_size=2, tasks_per_step=2, max_call_tokens=12, max_turns=2)
    gaps = {}
    for precision in ("fp32", "bf16"):
        model = copy.deepcopy(small_qwen3)
        model.set_precision(precision)
        trajs = sample_groups(model, make_env_factory(2, "hidden", True), train_tasks[:2], gym_chat, cfg,
                              torch.Generator().manual_seed(0))
        batch = prepare_batch(trajs, gym_chat, cfg)
        gaps[precision] = pre_update_pass(model, [batch])[1]["logp_gap"]
        model.log_probs(batch["ids"], batch["action_mask"] > 0)[0].sum().backward()
        assert all(p.dtype == torch.float32 and (p.grad is None or p.grad.dtype == torch.float32)
                   for p in model.parameters())
        assert all(w.dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
                   for w in model.sampler_weights.copies)
    assert gaps["fp32"] < 1e-5 and 1e-5 < gaps["bf16"] < 0.2, gaps


@pytest.mark.slow
@needs_tokenizer
def test_a_bf16_labs_preflight_checks_the_code_in_fp32_and_hands_back_a_bf16_model(small_qwen3, gym_chat,
                                                                                  train_tasks):
    """The invariants' tolerances are fp32's (bf16 rounding alone fails checks 2, 5 and 6 on SmolLM2): a bf16 lab's
    preflight gives exactly the gate of the same model held in fp32, and the model trains in bf16 afterwards (bf16
    sampler weights, fp32 masters)."""
    import copy

    from agentrl.core.config import RLConfig
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.labs.recipe import preflight
    cfg = RLConfig(group_size=2, tasks_per_step=2, max_call_tokens=12, max_turns=2)
    gates = {}
    for precision in ("fp32", "bf16"):
        model = copy.deepcopy(small_qwen3)
        model.set_precision(precision)
        gates[precision] = preflight(model, gym_chat, train_tasks[:2], cfg, make_env_factory(2, "hidden", True), 0)
        assert model.precision == precision
        with model.sampling():
            pass
        assert all(w.dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
                   for w in model.sampler_weights.copies)
        assert all(p.dtype == torch.float32 for p in model.parameters())
    assert gates["bf16"] == gates["fp32"] and gates["bf16"]["dtype"] == "fp32"
    assert gates["bf16"]["checks"]["sampler_trainer_gap"]["value"] < 1e-5, gates["bf16"]["checks"]


@pytest.mark.slow
@needs_tokenizer
def test_the_decision_tokens_of_a_call_are_its_tool_name_and_op(gym_chat):
    for name, args in (("edit", {"op": "fix_comparison"}), ("read", {})):
        turn = gym_chat.turn_ids(name, args)
        decided = gym_chat.decision_tokens(turn)
        assert gym_chat.decode([turn[i] for i in decided["name"]]).strip(' "') == name
        if args:
            assert gym_chat.decode([turn[i] for i in decided["op"]]).strip(' "') == "fix_comparison"
        else:
            assert "op" not in decided
    assert gym_chat.decision_tokens(gym_chat.answer_ids("I would rather not.")) == {}


@pytest.mark.slow
@needs_tokenizer
def test_the_rollout_records_each_calls_decision_entropy(small_qwen3, gym_chat, train_tasks):
    """Every call of a sampled episode has its decision entropy: the sampler's entropies at its decision tokens,
    summed (an untrained model's are large, and a turn without a call has none)."""
    from agentrl.core.config import RLConfig
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.rl.rollout import sample_groups
    cfg = RLConfig(group_size=2, tasks_per_step=1, max_call_tokens=8, max_turns=2)
    trajs = sample_groups(small_qwen3, make_env_factory(2, "hidden", True), train_tasks[:1], gym_chat, cfg,
                          torch.Generator().manual_seed(0))
    for t in trajs:
        assert len(t.decisions) == t.record.turns
        assert all(all(v >= 0 for v in call.values()) for call in t.decisions)
