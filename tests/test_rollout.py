"""Policy, rollout and batch: KV-cache sampling equals the trainer's forward, trajectory
invariants, collation, determinism, checkpoints."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from agentrl.core.config import RLConfig
from agentrl.env.gym.environment import END_CALL
from agentrl.env.gym.spec import GYM
from agentrl.model.checkpoints import CheckpointError, load_policy, read_checkpoint, save_policy
from agentrl.model.logprobs import selected_log_probs
from agentrl.model.policy import ModelConfig, TinyAgent
from agentrl.rl.rollout import OWNER, Trajectory, collate, pad_rows, sample_groups, sample_step
from agentrl.rl.trainer import forward_logp

CFG = RLConfig()
POLICY = OWNER["policy"]


def _sample(model, tok, tasks, seed, cfg=CFG):
    return sample_step(model, GYM.make(cfg), tasks, tok, cfg, torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def base_batch(quick_base, tok, train_tasks):
    kept, sampled = _sample(quick_base, tok, train_tasks, 0)
    return sampled


@pytest.fixture(scope="module")
def random_batch(random_model, tok, train_tasks):
    kept, sampled = _sample(random_model, tok, train_tasks, 0)
    return sampled


@pytest.fixture(scope="module")
def smooth_model(make_model):
    """A random-init model with small token embeddings: near-uniform next-token distributions (the default
    emb_std=1.0 makes a fresh model copy its input token with probability ~1, so its log-probs are ~0)."""
    model = make_model(seed=1, emb_std=0.02)
    model.eval()
    return model


@pytest.fixture(scope="module")
def smooth_batch(smooth_model, tok, train_tasks):
    kept, sampled = _sample(smooth_model, tok, train_tasks, 0)
    return sampled


MODEL_OF = {"base_batch": "quick_base", "random_batch": "random_model", "smooth_batch": "smooth_model"}


def _gap(model, trajs, pad_id):
    batch = collate(trajs, pad_id)
    with torch.no_grad():
        logits = model(batch["ids"])
        trainer = selected_log_probs(logits[:, :-1], batch["ids"][:, 1:])
        via_trainer_fn, _ = forward_logp(model, batch["ids"])
    mask = batch["action_mask"]
    assert torch.equal(trainer, via_trainer_fn)
    gap = (trainer - batch["sample_logp"]).abs() * mask
    return float(gap.max()), float(gap.sum() / mask.sum()), int(mask.sum())


# ---------------------------------------------------------------- KV-cache sampler == full forward

def test_quick_base_episodes_have_varied_turn_structure(base_batch):
    """Precondition of the cache test: rows of one batch are at different points of their turns."""
    turns = {t.record.turns for t in base_batch}
    assert len(turns) >= 3, turns
    assert max(turns) >= 3
    assert len({len(t.ids) for t in base_batch}) >= 10


@pytest.mark.parametrize("which", ["base_batch", "smooth_batch", "random_batch"])
def test_sampler_logp_matches_trainer_forward(which, request, tok):
    trajs = request.getfixturevalue(which)
    model = request.getfixturevalue(MODEL_OF[which])
    assert len(trajs) == CFG.group_size * CFG.tasks_per_step == 64
    gap_max, gap_mean, n = _gap(model, trajs, tok.pad_id)
    print(f"{which}: {n} policy tokens, sampler-trainer log-prob gap max {gap_max:.3g} mean {gap_mean:.3g}")
    assert gap_max < 1e-5
    assert gap_mean < 1e-6


def test_forward_cached_with_invalid_slots_equals_full_forward(make_model):
    model = make_model(seed=3, emb_std=0.02)  # a smooth random model: its logits are not dominated by the input
    model.eval()
    a = [2, 10, 11, 12, 13, 14, 15]
    b = [2, 20, 21, 22, 23]
    # slot layout (chunks of slots shared by both rows); None = invalid (padding) slot for that row
    chunks = [
        ([a[0], a[1], a[2]], [b[0], b[1], None]),
        ([a[3], a[4]], [None, None]),
        ([a[5]], [b[2]]),
        ([a[6], None], [b[3], b[4]]),
    ]
    cache = model.new_cache()
    got = {0: [], 1: []}
    length = [0, 0]
    with torch.no_grad():
        for chunk in chunks:
            L = len(chunk[0])
            ids = torch.zeros(2, L, dtype=torch.long)
            pos = torch.zeros(2, L, dtype=torch.long)
            valid = torch.zeros(2, L, dtype=torch.bool)
            for r in range(2):
                for j, t in enumerate(chunk[r]):
                    if t is not None:
                        ids[r, j], pos[r, j], valid[r, j] = t, length[r], True
                        length[r] += 1
                    else:
                        ids[r, j], pos[r, j] = 0, length[r]
            logits = model.forward_cached(ids, pos, valid, cache)
            for r in range(2):
                for j in range(L):
                    if valid[r, j]:
                        got[r].append(logits[r, j])
        full_a = model(torch.tensor([a]))[0]
        full_b = model(torch.tensor([b]))[0]
    assert len(got[0]) == len(a) and len(got[1]) == len(b)
    assert torch.allclose(torch.stack(got[0]), full_a, atol=1e-5, rtol=0), \
        float((torch.stack(got[0]) - full_a).abs().max())
    assert torch.allclose(torch.stack(got[1]), full_b, atol=1e-5, rtol=0), \
        float((torch.stack(got[1]) - full_b).abs().max())


def test_right_padding_does_not_change_the_full_forward(random_model):
    row = torch.tensor([[2, 10, 11, 12]])
    padded = torch.tensor([[2, 10, 11, 12, 0, 0, 0]])
    with torch.no_grad():
        assert torch.allclose(random_model(row)[0], random_model(padded)[0, :4], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- trajectory invariants

@pytest.mark.parametrize("which", ["base_batch", "smooth_batch", "random_batch"])
def test_trajectory_invariants(which, request, tok):
    trajs = request.getfixturevalue(which)
    end_call = tok.id(END_CALL)
    for t in trajs:
        n = len(t.ids)
        assert len(t.owner) == n
        assert len(t.sample_logp) == n - 1 == len(t.action_mask)
        assert t.action_mask == [int(o == POLICY) for o in t.owner[1:]]
        for i, (m, lp) in enumerate(zip(t.action_mask, t.sample_logp)):
            if m:
                assert lp <= 0.0, (i, lp)
            else:
                assert lp == 0.0, (i, lp)
        assert t.owner[-1] == POLICY, "every episode ends on the policy's own last token"
        assert t.owner[:3] == [OWNER["prompt"]] * 3 and POLICY not in t.owner[:3] and t.owner[3] == POLICY
        assert t.ids[:2] == tok.encode(["<bos>", "fix"])
        # policy runs = calls: at most max_call_tokens long, cut off only at the limit; one per turn
        runs, cur = [], []
        for i, o in enumerate(t.owner):
            if o == POLICY:
                cur.append(t.ids[i])
            elif cur:
                runs.append(cur)
                cur = []
        runs.append(cur)
        assert len(runs) == t.record.turns
        for call in runs:
            assert 1 <= len(call) <= CFG.max_call_tokens
            assert call[-1] == end_call or len(call) == CFG.max_call_tokens
            assert end_call not in call[:-1]
        # env segments are whole observations
        env_text = tok.decode([i for i, o in zip(t.ids, t.owner) if o == OWNER["env"]]).split()
        assert env_text.count("<obs>") == env_text.count("</obs>") == t.record.turns - 1
        assert t.reward == float(t.record.finished and t.record.hidden_pass)
    if which != "random_batch":
        assert any(lp < 0 for t in trajs for lp in t.sample_logp)


def test_groups_are_contiguous(base_batch, train_tasks):
    G = CFG.group_size
    assert len(base_batch) == G * CFG.tasks_per_step
    tasks_seen = []
    for g in range(CFG.tasks_per_step):
        rows = base_batch[g * G:(g + 1) * G]
        assert {t.group for t in rows} == {g}
        assert len({t.record.task for t in rows}) == 1
        tasks_seen.append(rows[0].record.task)
    assert len(set(tasks_seen)) == CFG.tasks_per_step  # distinct tasks per step
    assert set(tasks_seen) <= {t.name for t in train_tasks}


def test_sample_groups_order(quick_base, tok, train_tasks):
    cfg = RLConfig(group_size=3, tasks_per_step=2)
    tasks = [train_tasks[5], train_tasks[0]]
    trajs = sample_groups(quick_base, GYM.make(cfg), tasks, tok, cfg, torch.Generator().manual_seed(0))
    assert [t.record.task for t in trajs] == [tasks[0].name] * 3 + [tasks[1].name] * 3
    assert [t.group for t in trajs] == [0, 0, 0, 1, 1, 1]


def test_keep_informative_drops_groups_with_equal_rewards(quick_base, tok, train_tasks):
    cfg = RLConfig(group_size=4, tasks_per_step=4, keep="informative")
    kept, sampled = _sample(quick_base, tok, train_tasks, 0, cfg)
    assert len(sampled) == 16
    groups = {}
    for t in kept:
        groups.setdefault(t.group, []).append(t)
    for rows in groups.values():
        assert len(rows) == cfg.group_size and len({t.reward for t in rows}) > 1
    expected = sum(len({t.reward for t in sampled[g * 4:(g + 1) * 4]}) > 1 for g in range(4))
    assert len(groups) == expected


# ---------------------------------------------------------------- collate

def test_collate_shapes_and_padding(base_batch, tok):
    batch = collate(base_batch, tok.pad_id)
    B = len(base_batch)
    T = max(len(t.ids) for t in base_batch)
    assert batch["ids"].shape == batch["attention_mask"].shape == (B, T)
    assert batch["action_mask"].shape == batch["sample_logp"].shape == (B, T - 1)
    assert batch["rewards"].shape == batch["group"].shape == (B,)
    for i, t in enumerate(base_batch):
        n = len(t.ids)
        assert batch["ids"][i, :n].tolist() == t.ids
        assert (batch["ids"][i, n:] == tok.pad_id).all()
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (T - n)
        assert batch["action_mask"][i, :n - 1].tolist() == t.action_mask
        assert (batch["action_mask"][i, n - 1:] == 0).all()
        assert torch.allclose(batch["sample_logp"][i, :n - 1], torch.tensor(t.sample_logp))
        assert (batch["sample_logp"][i, n - 1:] == 0).all()
        assert float(batch["rewards"][i]) == t.reward and int(batch["group"][i]) == t.group
        # the last policy token is the row's last real token: its target column is n-2
        assert batch["action_mask"][i, n - 2] == 1
    wide = collate(base_batch, tok.pad_id, width=T + 5)
    assert wide["ids"].shape == wide["attention_mask"].shape == (B, T + 5)
    assert wide["action_mask"].shape == wide["sample_logp"].shape == (B, T + 4)
    assert torch.equal(wide["ids"][:, :T], batch["ids"]) and (wide["ids"][:, T:] == tok.pad_id).all()
    assert torch.equal(wide["action_mask"][:, :T - 1], batch["action_mask"])
    assert (wide["action_mask"][:, T - 1:] == 0).all() and (wide["attention_mask"][:, T:] == 0).all()


def test_pad_rows():
    out = pad_rows([[1, 2, 3], [], [4]], 0)
    assert out.tolist() == [[1, 2, 3], [0, 0, 0], [4, 0, 0]]
    assert pad_rows([[1]], 9, width=3).tolist() == [[1, 9, 9]]


def test_trajectory_rejects_misaligned_logp():
    with pytest.raises(AssertionError):
        Trajectory([1, 2, 3], [0, 1, 1], [0.0], 0.0, None)


# ---------------------------------------------------------------- determinism

def test_same_seed_same_trajectories_different_seed_different(quick_base, tok, train_tasks):
    cfg = RLConfig(group_size=4, tasks_per_step=4)

    def key(trajs):
        return [(t.ids, t.owner, t.sample_logp, t.reward, t.group, t.record.name) for t in trajs]

    first = key(_sample(quick_base, tok, train_tasks, 7, cfg)[1])
    again = key(_sample(quick_base, tok, train_tasks, 7, cfg)[1])
    other = key(_sample(quick_base, tok, train_tasks, 8, cfg)[1])
    assert first == again
    assert first != other
    assert [k[0] for k in first] != [k[0] for k in other]


# ---------------------------------------------------------------- checkpoints

def test_checkpoint_round_trip(tmp_path, quick_base, tok):
    path = tmp_path / "ckpt" / "policy.pt"
    save_policy(path, quick_base, tok.hash, extra={"step": 3})
    model, extra = load_policy(path, tok.hash, expect_config=quick_base.cfg)
    assert extra == {"step": 3}
    assert model.cfg == quick_base.cfg
    a, b = quick_base.state_dict(), model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ids = torch.tensor([[2, 10, 11, 12]])
    with torch.no_grad():
        assert torch.equal(quick_base(ids), model(ids))
    assert not list(path.parent.glob("*.tmp"))


def test_missing_checkpoint(tmp_path, tok):
    with pytest.raises(CheckpointError, match="not found"):
        load_policy(tmp_path / "nope.pt", tok.hash)


def test_truncated_checkpoint_gives_a_clear_error(tmp_path, random_model, tok):
    path = tmp_path / "policy.pt"
    save_policy(path, random_model, tok.hash)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError) as exc:
        load_policy(path, tok.hash)
    msg = str(exc.value)
    assert "\n" not in msg
    assert str(path) in msg and ("corrupt" in msg or "unreadable" in msg)
    assert "PytorchStreamReader" not in msg and "zip" not in msg.lower()


def test_checkpoint_from_another_tokenizer(tmp_path, random_model, tok):
    path = tmp_path / "policy.pt"
    save_policy(path, random_model, "0123456789abcdef")
    with pytest.raises(CheckpointError) as exc:
        load_policy(path, tok.hash)
    msg = str(exc.value)
    assert "tokenizer" in msg and "0123456789abcdef" in msg and tok.hash in msg and "\n" not in msg


def test_checkpoint_from_another_model_config(tmp_path, make_model, tok):
    small = make_model(seed=0, d_model=32, d_ff=64)
    path = tmp_path / "small.pt"
    save_policy(path, small, tok.hash)
    expect = ModelConfig(len(tok))
    with pytest.raises(CheckpointError) as exc:
        load_policy(path, tok.hash, expect_config=expect)
    msg = str(exc.value)
    assert "model config" in msg and "d_model" in msg and "\n" not in msg
    # through the params section of the model, as the stages load it (the backend's load)
    from agentrl.backends.tinyagent import TINYAGENT
    from agentrl.core.config import ModelParams
    with pytest.raises(CheckpointError, match="model config"):
        TINYAGENT.load(path, tok, ModelParams())


def test_checkpoint_whose_weights_do_not_fit_its_config(tmp_path, random_model, tok):
    path = tmp_path / "policy.pt"
    save_policy(path, random_model, tok.hash)
    payload = torch.load(path, weights_only=True)
    payload["config"] = dict(payload["config"], d_ff=128)
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="do not fit"):
        load_policy(path, tok.hash)


UNPICKLED = []


def _record_unpickling():
    UNPICKLED.append(True)
    return "pwned"


class Poison:
    def __reduce__(self):
        return (_record_unpickling, ())


def test_checkpoints_are_loaded_with_weights_only(tmp_path, random_model, tok, monkeypatch):
    path = tmp_path / "poison.pt"
    payload = {"config": random_model.cfg.to_dict(), "tokenizer_hash": tok.hash,
               "state_dict": random_model.state_dict(), "extra": {"note": Poison()}}
    torch.save(payload, path)
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    with pytest.raises(CheckpointError) as exc:
        load_policy(path, tok.hash)
    assert not UNPICKLED, "a pickled object was executed while loading a checkpoint"
    assert calls and all(c.get("weights_only") is True for c in calls)
    assert "\n" not in str(exc.value)
    with pytest.raises(CheckpointError):
        read_checkpoint(path)


def test_non_checkpoint_file(tmp_path, tok):
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, path)
    with pytest.raises(CheckpointError, match="not an agentrl checkpoint"):
        load_policy(path, tok.hash)


# ---------------------------------------------------------------- the model

def test_parameter_count_of_the_default_model(tok):
    model = TinyAgent(ModelConfig(len(tok)))
    n = model.num_params()
    print(f"TinyAgent default ModelConfig(vocab {len(tok)}): {n} parameters")
    assert n == sum(p.numel() for p in model.parameters())
    assert 150_000 <= n <= 200_000, n


def test_params_yaml_model_matches_model_config_defaults(tok):
    """The model section of params.yaml and ModelConfig's defaults describe the same network."""
    from agentrl.core.config import ModelParams
    params = dataclasses.asdict(ModelParams())
    defaults = ModelConfig(len(tok)).to_dict()
    for k, v in params.items():
        assert defaults[k] == v, f"ModelParams.{k}={v} but ModelConfig.{k}={defaults[k]}"


def test_init_is_deterministic_and_uses_the_generator(tok):
    a = TinyAgent(ModelConfig(len(tok)), generator=torch.Generator().manual_seed(0))
    b = TinyAgent(ModelConfig(len(tok)), generator=torch.Generator().manual_seed(0))
    c = TinyAgent(ModelConfig(len(tok)), generator=torch.Generator().manual_seed(1))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["tok_emb.weight"], sc["tok_emb.weight"])
