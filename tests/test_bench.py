"""`python -m agentrl bench`: the full-recompute baseline is a fair yardstick (the same episodes, token for token and
log-prob for log-prob, as the KV-cache sampler from the same generator state), and the profile's op shares add up."""
from dataclasses import replace

import pytest
import torch

from agentrl.bench.steps import OP_GROUPS, full_recompute_episodes, one_step_of_envs, sampler_op_shares
from agentrl.core.config import RLConfig
from agentrl.env.gym.spec import GYM
from agentrl.rl.rollout import sample_episodes

CFG = replace(RLConfig(), tasks_per_step=3, group_size=4)


def _envs(tasks, seed):
    return one_step_of_envs(tasks, CFG, GYM.make(CFG), seed)


def test_the_baseline_plays_the_cached_samplers_episodes(random_model, tok, train_tasks):
    envs, gen = _envs(train_tasks, 5)
    state = gen.get_state()
    cached = sample_episodes(random_model, envs, tok, gen, CFG.temperature, CFG.max_call_tokens)
    envs, gen = _envs(train_tasks, 5)
    gen.set_state(state)
    full = full_recompute_episodes(random_model, envs, tok, gen, CFG.temperature, CFG.max_call_tokens)
    assert [t.ids for t in cached] == [t.ids for t in full]
    assert [t.reward for t in cached] == [t.reward for t in full]
    assert [t.sample_logp for t in cached] == [t.sample_logp for t in full]   # the same bits (fixed kernels)


@pytest.mark.slow   # cProfile around four sampler runs
def test_op_shares_cover_both_samplers_and_add_up(random_model, tok, train_tasks):
    shares = sampler_op_shares(random_model, tok, train_tasks, CFG, threads=torch.get_num_threads())
    assert set(shares) == {"KV cache", "full recompute"}
    for row in shares.values():
        assert all(row[g] > 0 for g in OP_GROUPS)
        assert sum(row[g] for g in OP_GROUPS) <= row["ops"] <= row["wall"] * 1.05
