"""Starting policies: the behaviour-cloned RL base and the SFT cold start.

The RL base stands in for a pretrained model: a fresh TinyAgent cloned from a scripted mixture that knows the
call format, sometimes reads and then (often) picks the keyword rule's op, otherwise guesses, and now and
then emits a malformed call or the hardcode_tests exploit (and, if base.p_persist > 0, keeps trying after a
test shows a failure instead of submitting, so failed episodes can run long). Cloning matches the mixture's
exact next-token distribution at every policy token (soft targets), so the base's behaviour is set by the
mixture's probabilities rather than by sampling noise in a few thousand demonstrations.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from agentrl.core.config import BaseConfig, ConfigError
from agentrl.core.seeding import generator as stream_generator
from agentrl.env.gym.callers import call_tokens
from agentrl.env.gym.environment import filler_operands, make_env_factory
from agentrl.env.ops import REPAIR_OPS, keyword_rule
from agentrl.model.policy import ModelConfig, TinyAgent
from agentrl.rl.objectives import masked_mean
from agentrl.rl.optim import Adam
from agentrl.rl.rollout import OWNER, Trajectory, collate
from agentrl.rl.trainer import forward_logp


@dataclass
class Demo:
    """A demonstration played through the real environment, with the demonstrator's next-token distribution
    at each policy token (soft[i] for target ids[i+1]; None for non-policy targets)."""
    traj: Trajectory
    soft: list[dict[int, float] | None]


def play_demo(env, caller, tok, generator: torch.Generator) -> Demo:
    """Play a distributional caller through the environment. caller.distribution(obs) -> [(p, call_tokens)]
    is the target; the call actually played is drawn from caller.coverage(obs) (same support, reweighted so
    rare but important states such as 'after a read' appear often enough to be learned); caller.observe(call)
    advances its state."""
    toks = env.reset()
    owner = [OWNER["prompt"]] * len(toks)
    soft: list = [None] * (len(toks) - 1)
    obs = None
    while not env.done:
        dist = caller.distribution(obs)
        probs = torch.tensor(caller.coverage(dist), dtype=torch.float64, device=generator.device)
        call = dist[int(torch.multinomial(probs, 1, generator=generator))][1]
        for k in range(len(call)):
            cond: dict[int, float] = defaultdict(float)
            for p, alt in dist:
                if alt[:k] == call[:k] and len(alt) > k:
                    cond[tok.id(alt[k])] += p
            z = sum(cond.values())
            soft.append({t: p / z for t, p in cond.items()})
        caller.observe(call)
        toks += call
        owner += [OWNER["policy"]] * len(call)
        obs = env.step(call)
        if obs is not None:
            toks += obs
            owner += [OWNER["env"]] * len(obs)
            soft += [None] * len(obs)
    ids = tok.encode(toks)
    return Demo(Trajectory(ids, owner, [0.0] * (len(ids) - 1), env.reward, env.record()), soft)


def sparse_targets(demo: Demo) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions, token ids, probabilities) of a demo's soft targets, computed once per demo."""
    if not hasattr(demo, "_sparse"):
        rows = [(i, t, p) for i, dist in enumerate(demo.soft) if dist for t, p in dist.items()]
        pos, tid, prob = zip(*rows)
        demo._sparse = (torch.tensor(pos), torch.tensor(tid), torch.tensor(prob, dtype=torch.float32))
    return demo._sparse


def soft_targets(demos: list[Demo], width: int, vocab: int) -> torch.Tensor:
    """Dense next-token targets [B, width, V] (zero rows off policy tokens)."""
    out = torch.zeros(len(demos), width, vocab)
    for b, d in enumerate(demos):
        pos, tid, prob = sparse_targets(d)
        out[b, pos, tid] = prob
    return out


def choice_weights(targets: torch.Tensor, mask: torch.Tensor, weight: float) -> torch.Tensor:
    """Per-token loss weights [B, T-1]: `weight` where the demonstrator had a real choice (target not one-hot).
    Every position's cross-entropy is still minimised by its own target, so the weights change how fast the
    choices are learned, not what is learned."""
    choice = (targets.max(-1).values < 1.0).float()
    return mask * (1.0 + (weight - 1.0) * choice)


def sft_step(model, optimizer, batch: dict, targets: torch.Tensor | None = None,
             weights: torch.Tensor | None = None) -> float:
    """One cross-entropy step on the policy tokens of demonstrations (token mean). With soft targets
    [B, T-1, V], the cross-entropy is against the demonstrator's distribution instead of the sampled token;
    weights [B, T-1] (default: the action mask) make it a weighted mean."""
    mask = batch["action_mask"] if weights is None else weights
    if targets is None:
        logp, _ = forward_logp(model, batch["ids"], mask > 0)
        loss = -masked_mean(logp, mask)
    else:
        taught = mask > 0                                  # [B, T-1]: the positions with a target
        logits = model.logits(batch["ids"], F.pad(taught, (0, 1)))   # the logits after those tokens only [N, V]
        ce = -(targets[taught] * torch.log_softmax(logits, dim=-1)).sum(-1)
        loss = (ce * mask[taught]).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def train_sft(model, demos: list, tok, steps: int, lr: float, batch_size: int | None = None,
              generator: torch.Generator | None = None, choice_weight: float = 1.0, on_step=None) -> list[float]:
    """`steps` Adam steps of cross-entropy on demonstrations (Trajectory: hard targets, Demo: soft targets):
    the full set each step, or batch_size demonstrations drawn with the generator. on_step(step, loss), if given,
    is called after each step (1-based), e.g. to probe the policy along the way."""
    if not isinstance(steps, int) or steps <= 0:
        raise ConfigError(f"steps: expected an integer > 0, got {steps!r}")
    optimizer = Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        chosen = demos if batch_size is None else \
            [demos[i] for i in torch.randint(len(demos), (batch_size,), generator=generator,
                                             device=generator.device).tolist()]
        trajs = [d.traj if isinstance(d, Demo) else d for d in chosen]
        batch = collate(trajs, tok.pad_id)
        targets = weights = None
        if isinstance(chosen[0], Demo):
            targets = soft_targets(chosen, batch["ids"].shape[1] - 1, len(tok))
            weights = choice_weights(targets, batch["action_mask"], choice_weight)
        losses.append(sft_step(model, optimizer, batch, targets, weights))
        if on_step is not None:
            on_step(len(losses), losses[-1])
    return losses


# ---------------------------------------------------------------- demonstrators

class OracleCaller:
    """The SFT demonstration: read, edit with the task's oracle op, test, submit."""

    def __init__(self, op: str):
        self.plan = [call_tokens("read"), call_tokens("edit", op), call_tokens("test"), call_tokens("submit")]

    def distribution(self, obs):
        return [(1.0, self.plan[0])]

    def coverage(self, dist):
        return [p for p, _ in dist]

    def observe(self, call):
        self.plan.pop(0)


def oracle_demos(tasks: list, tok, generator: torch.Generator, max_turns: int = 6) -> list[Trajectory]:
    """One oracle demonstration per task, with a freshly drawn function name (hard targets)."""
    factory = make_env_factory(max_turns, "hidden", rename=True)
    return [play_demo(factory(task, generator), OracleCaller(task.oracle), tok, generator).traj for task in tasks]


MALFORMED_CALLS = (["<call>", "fix_range", "</call>"], ["<call>", "edit", "</call>"],
                   ["<call>", "read", "read", "</call>"], ["<call>", "submit", "test", "</call>"],
                   ["<call>", "edit", "read", "</call>"])


class MixtureCaller:
    """The scripted mixture, as a distribution over whole calls at each turn."""

    def __init__(self, cfg: BaseConfig):
        self.cfg = cfg
        self.stage = "start"   # start -> (read) -> edit -> (test) -> submit
        self.read_op = None    # the keyword rule's op, once the source has been read
        self.last_tool = None
        self.saw_failure = False  # a test has shown a failing public test

    def _guesses(self, mass: float) -> list:
        c = self.cfg
        return [(mass * c.p_hardcode, call_tokens("edit", "hardcode_tests"))] + \
               [(mass * (1 - c.p_hardcode) / len(REPAIR_OPS), call_tokens("edit", op)) for op in REPAIR_OPS]

    def _intended(self, obs) -> list:
        c = self.cfg
        give_up = [(c.p_give_up, call_tokens("submit"))]
        if self.stage == "start":
            return [(c.p_read, call_tokens("read"))] + [(p * (1 - c.p_read), call) for p, call in give_up] + \
                self._guesses((1 - c.p_read) * (1 - c.p_give_up))
        if self.stage == "edit":
            if self.read_op is None and obs and obs[0] == "<obs>" and "def" in obs:
                self.read_op = keyword_rule(obs)
            if self.read_op is None:
                return give_up + self._guesses(1 - c.p_give_up)
            keep = 1 - c.p_give_up
            return give_up + [(keep * c.p_right_after_read, call_tokens("edit", self.read_op))] + \
                self._guesses(keep * (1 - c.p_right_after_read))
        if self.stage == "after_edit":
            return [(c.p_test, call_tokens("test")), (1 - c.p_test, call_tokens("submit"))]
        if self.saw_failure:  # keep trying: look again, test again, or attempt another repair (the gym refuses it)
            p = c.p_persist
            retry = [(p / 4, call_tokens("read")), (p / 4, call_tokens("test"))] + \
                [(p / 2 / len(REPAIR_OPS), call_tokens("edit", op)) for op in REPAIR_OPS]
            return retry + [(1 - p, call_tokens("submit"))]
        return [(1.0, call_tokens("submit"))]

    def distribution(self, obs) -> list:
        if self.last_tool == "test" and obs and "fail" in obs:
            self.saw_failure = True
        pm = self.cfg.p_malformed
        intended = [(p * (1 - pm), call) for p, call in self._intended(obs) if p > 0]
        return intended + [(pm / len(MALFORMED_CALLS), list(m)) for m in MALFORMED_CALLS]

    def coverage(self, dist: list) -> list[float]:
        """Probabilities to play: at the first call, `read` gets mass cover_read (the rest keeps its shape)."""
        probs = [p for p, _ in dist]
        if self.stage != "start":
            return probs
        i = next(i for i, (_, call) in enumerate(dist) if call == call_tokens("read"))
        rest = sum(probs) - probs[i]
        return [self.cfg.cover_read if j == i else p * (1 - self.cfg.cover_read) / rest for j, p in enumerate(probs)]

    def observe(self, call: list[str]) -> None:
        body = call[1:-1]
        self.last_tool = body[0] if body else None
        if body == ["read"] and self.stage == "start":
            self.stage = "edit"
        elif len(body) == 2 and body[0] == "edit" and self.stage in ("start", "edit"):
            self.stage = "after_edit"
        elif body == ["test"] and self.stage == "after_edit":
            self.stage = "submit"


def mixture_demos(tasks: list, tok, cfg: BaseConfig, generator: torch.Generator, max_turns: int = 6) -> list[Demo]:
    factory = make_env_factory(max_turns, "hidden", rename=True)
    demos = []
    for task in tasks:
        for _ in range(cfg.demos_per_task):
            env = factory(task, generator)
            if float(torch.rand((), generator=generator, device=generator.device)) < cfg.p_rename_operands:
                env.operands = filler_operands(task, env.name, generator)
            demos.append(play_demo(env, MixtureCaller(cfg), tok, generator))
    return demos


def make_rl_base(tok, tasks: list, cfg: BaseConfig | None = None, model_cfg: ModelConfig | None = None,
                 seed: int = 0) -> tuple[TinyAgent, dict]:
    """The 'pretrained' starting policy: a fresh TinyAgent cloned from the scripted mixture played on the
    given (train) tasks. Deterministic given the seed and the thread count. Returns (model, info)."""
    cfg = cfg or BaseConfig()
    model_cfg = model_cfg or ModelConfig(vocab_size=len(tok))
    gen = stream_generator(seed)  # the root stream: model init, demonstrations and cloning batches
    model = TinyAgent(model_cfg, generator=gen)
    if cfg.teach_steps:
        # Learning *that* the op depends on what was read is slow when the dependence is weak; teach it on a
        # mixture whose reads always lead to the keyword op, then clone the real mixture (same features,
        # calibrated probabilities).
        teach = mixture_demos(tasks, tok, replace(cfg, p_right_after_read=1.0), gen)
        train_sft(model, teach, tok, cfg.teach_steps, cfg.lr, cfg.batch_size, gen, cfg.choice_weight)
    demos = mixture_demos(tasks, tok, cfg, gen)
    losses = train_sft(model, demos, tok, cfg.steps, cfg.lr, cfg.batch_size, gen, cfg.choice_weight)
    info = {"demos": len(demos), "demo_policy_tokens": sum(d.traj.n_policy_tokens for d in demos),
            "demo_pass": sum(d.traj.reward for d in demos) / len(demos),
            "loss_first": losses[0], "loss_last": sum(losses[-20:]) / len(losses[-20:])}
    return model, info
