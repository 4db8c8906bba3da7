"""The SFT cold start: a few hundred supervised tokens and 10 steps raise pass@1 and the share of groups with a
gradient over the RL base and lower its entropy; the base is cloned reproducibly from the scripted mixture."""
import copy

import pytest
import torch

from agentrl.core.config import BaseConfig, RLConfig, SFTConfig
from agentrl.env.gym.spec import GYM
from agentrl.env.tasks import make_tasks
from agentrl.eval.evaluation import describe
from agentrl.starting.tinyagent import MixtureCaller, oracle_demos, train_sft


def test_sft_cold_start_beats_the_base(rl_base, tok):
    cfg = SFTConfig()
    demos = oracle_demos(make_tasks("train"), tok, torch.Generator().manual_seed(0))
    tokens = sum(d.n_policy_tokens for d in demos)
    sft = copy.deepcopy(rl_base)
    losses = train_sft(sft, demos, tok, cfg.steps, cfg.lr)
    table = {}
    for name, model in (("base", rl_base), ("sft", sft)):
        table[name] = describe(model, make_tasks("train"), tok, 16, torch.Generator().manual_seed(7), RLConfig(),
                               env=GYM.make(RLConfig(), evaluation=True))
    for name, d in table.items():
        print(f"{name}: pass@1 {d['pass_at_1']:.3f} pass@8 {d['pass_at_8']:.3f} groups with gradient "
              f"{d['groups_with_gradient']:.2f} entropy {d['entropy']:.3f} reads {d['reads']:.2f}")
    print(f"SFT: {len(demos)} demonstrations, {tokens} supervised tokens, {cfg.steps} steps, loss "
          f"{losses[0]:.3f} -> {losses[-1]:.3f}")
    assert len(demos) == 20 and 100 <= tokens <= 1000 and cfg.steps == 10
    assert table["sft"]["pass_at_1"] > table["base"]["pass_at_1"]
    assert table["sft"]["groups_with_gradient"] > table["base"]["groups_with_gradient"]
    assert table["sft"]["entropy"] < table["base"]["entropy"]
    assert table["sft"]["pass_at_8"] >= table["sft"]["pass_at_1"]


def test_oracle_demonstrations_are_real_episodes(tok):
    demos = oracle_demos(make_tasks("train"), tok, torch.Generator().manual_seed(0))
    for d in demos:
        calls = d.record.calls
        assert d.reward == 1.0 and calls[0] == "read" and calls[1].startswith("edit:")
        assert calls[2:] == ("test", "submit")
        assert tok.decode(d.ids).split()[:2] == ["<bos>", "fix"]


def test_mixture_distribution_is_a_distribution_and_reads_lead_to_the_keyword_op():
    cfg = BaseConfig()
    caller = MixtureCaller(cfg)
    first = caller.distribution(None)
    assert abs(sum(p for p, _ in first) - 1) < 1e-12
    read = sum(p for p, call in first if call == ["<call>", "read", "</call>"])
    assert abs(read - cfg.p_read * (1 - cfg.p_malformed)) < 1e-12
    caller.observe(["<call>", "read", "</call>"])
    obs = ["<obs>", "def", "alpha", "(", "xs", ")", ":", "<nl>", "return", "min", "(", "xs", ")", "</obs>"]
    after: dict[str, float] = {}
    for p, call in caller.distribution(obs):  # an op can appear twice: the keyword choice and a guess
        after[" ".join(call)] = after.get(" ".join(call), 0.0) + p
    right = after["<call> edit swap_minmax </call>"]
    wrong = after["<call> edit fix_range </call>"]
    assert right > wrong > 0


def test_mixture_keeps_trying_after_a_failed_test_and_submits_after_a_passing_one():
    cfg = BaseConfig(p_persist=0.6)
    pm = cfg.p_malformed

    def after_test(result: str) -> tuple[MixtureCaller, dict]:
        caller = MixtureCaller(cfg)
        caller.distribution(None)
        caller.observe(["<call>", "edit", "swap_minmax", "</call>"])
        caller.distribution(["<obs>", "edited", "</obs>"])
        caller.observe(["<call>", "test", "</call>"])
        dist = caller.distribution(["<obs>", result, "(", "2", ")", "->", "1", "want", "2", "</obs>"])
        return caller, {" ".join(c): p for p, c in dist}

    _, passed = after_test("pass")
    assert passed["<call> submit </call>"] == pytest.approx(1 - pm)
    caller, failed = after_test("fail")
    assert abs(sum(failed.values()) - 1) < 1e-12
    assert failed["<call> submit </call>"] == pytest.approx((1 - cfg.p_persist) * (1 - pm))
    assert failed["<call> read </call>"] == pytest.approx(cfg.p_persist / 4 * (1 - pm))
    assert failed["<call> test </call>"] == pytest.approx(cfg.p_persist / 4 * (1 - pm))
    # it keeps trying on later turns too (the failure stays known after a read)
    caller.observe(["<call>", "read", "</call>"])
    later = {" ".join(c): p for p, c in caller.distribution(["<obs>", "def", "alpha", "</obs>"])}
    assert later["<call> submit </call>"] == pytest.approx((1 - cfg.p_persist) * (1 - pm))


def test_mixture_without_persistence_always_submits_after_a_test():
    """base.p_persist = 0 (the default): the mixture submits after any test, as it did before the knob existed."""
    caller = MixtureCaller(BaseConfig())
    caller.distribution(None)
    caller.observe(["<call>", "edit", "fix_range", "</call>"])
    caller.distribution(["<obs>", "edited", "</obs>"])
    caller.observe(["<call>", "test", "</call>"])
    dist = {" ".join(c): p for p, c in caller.distribution(["<obs>", "fail", "(", "2", ")", "</obs>"])}
    assert dist["<call> submit </call>"] == pytest.approx(1 - BaseConfig().p_malformed)
    assert "<call> read </call>" not in dist and "<call> test </call>" not in dist
