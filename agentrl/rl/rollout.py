"""Token-in/token-out rollout: batched KV-cache sampling of whole episodes, trajectories, collation.

The ids the sampler produced are exactly the ids trained on; nothing is re-tokenized. Each trajectory keeps
its token owners (prompt / policy / env), the action mask aligned to ids[1:] and the sampler's log-prob of
every policy token, so the trainer can check itself against the sampler.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from agentrl.core.variants import KEEP_MODES, TASK_DRAWS
from agentrl.env.base import EpisodeRecord
from agentrl.model.logprobs import draw
from agentrl.model.packing import pad_rows

OWNER = {"prompt": 0, "policy": 1, "env": 2}


@dataclass
class Trajectory:
    ids: list[int]
    owner: list[int]            # per token, values of OWNER
    sample_logp: list[float]    # aligned to ids[1:]: the sampler's log-prob of each policy token, 0 elsewhere
    reward: float
    record: EpisodeRecord       # what the episode did (agentrl.env.base)
    group: int = 0
    decisions: list = field(default_factory=list)   # per call, {key: nats}: the sampler's entropy summed over the
                                                    # tokens that decide it (formats with `decision_tokens` only)
    sample_entropy: list | None = None   # aligned to ids[1:]: the entropy (nats) of the distribution each policy
                                         # token was drawn from, 0 elsewhere (sample_episodes(token_entropy=True))
    action_mask: list[int] = field(init=False)  # aligned to ids[1:]: 1 where the target was sampled by the policy

    def __post_init__(self):
        self.action_mask = [int(o == OWNER["policy"]) for o in self.owner[1:]]
        assert len(self.sample_logp) == len(self.ids) - 1 == len(self.action_mask)

    @property
    def n_policy_tokens(self) -> int:
        return sum(self.action_mask)


@torch.inference_mode()
def sample_episodes(model, envs: list, fmt, generator: torch.Generator, temperature: float = 1.0,
                    max_call_tokens: int = 5, token_entropy: bool = False) -> list[Trajectory]:
    """Play every env to the end with the backend's batched, KV-cached sampler (model.sampler), in the conversation
    format `fmt` (agentrl.env.formats; the gym's word-level tokenizer is one). Rows advance turn by
    turn together: each token is one forward over the rows still in their turn, each round of environment replies
    one forward over the rows that got one, and a row whose episode ended leaves the cache. With `token_entropy`, each
    trajectory keeps the entropy of every policy token's distribution (an evaluation's entropy without a second
    pass over its episodes)."""
    ids = [fmt.prompt(env) for env in envs]
    owner = [[OWNER["prompt"]] * len(r) for r in ids]
    logp = [[0.0] * len(r) for r in ids]  # aligned to ids; shifted to ids[1:] at the end
    spread = [[0.0] * len(r) for r in ids] if token_entropy else None   # aligned as logp
    sampler = model.sampler(fmt.pad_id)
    alive = list(range(len(envs)))                     # the episode of each sampler row
    decide = getattr(fmt, "decision_tokens", None)
    decisions = [[] for _ in envs]
    last_logits = sampler.append(ids)
    while alive:
        calls, call_logp, call_entropy = _sample_calls(sampler, last_logits, generator, temperature,
                                                       max_call_tokens, fmt.stop_id, fmt.pad_id,
                                                       decide is not None or token_entropy)
        replies, going = [], []
        for i, r in enumerate(alive):
            ids[r] += calls[i]
            owner[r] += [OWNER["policy"]] * len(calls[i])
            logp[r] += call_logp[i]
            if token_entropy:
                spread[r] += call_entropy[i]
            if decide is not None:
                decisions[r].append({key: sum(call_entropy[i][k] for k in at)
                                     for key, at in decide(calls[i]).items()})
            obs = envs[r].step(fmt.action(calls[i]))
            if obs is not None:  # otherwise the episode ended on the policy's own last token
                reply = fmt.reply(obs, closed=calls[i][-1] == fmt.stop_id)
                ids[r] += reply
                owner[r] += [OWNER["env"]] * len(reply)
                logp[r] += [0.0] * len(reply)
                if token_entropy:
                    spread[r] += [0.0] * len(reply)
                replies.append(reply)
                going.append(i)
        if not going:
            break
        if len(going) < len(alive):
            sampler.keep(torch.tensor(going))
            alive = [alive[i] for i in going]
        last_logits = sampler.append(replies)
    return [Trajectory(ids[r], owner[r], logp[r][1:], env.reward, env.record(), decisions=decisions[r],
                       sample_entropy=spread[r][1:] if token_entropy else None)
            for r, env in enumerate(envs)]


def _sample_calls(sampler, last_logits: torch.Tensor, generator: torch.Generator, temperature: float,
                  max_call_tokens: int, end_call: int, pad_id: int, entropy: bool = False):
    """Every sampler row generates one turn, token by token: one draw from softmax(logits / temperature) and one
    cached forward per token over the rows still in their turn, until `end_call` or max_call_tokens. Updates
    last_logits in place; returns the turns' ids, the sampler's log-probs and (with `entropy`, else None) the
    entropy of each drawn token's distribution, one list per row."""
    n = last_logits.shape[0]
    tokens = torch.full((n, max_call_tokens), pad_id, dtype=torch.long)
    token_logp = torch.zeros(n, max_call_tokens)
    token_entropy = torch.zeros(n, max_call_tokens) if entropy else None
    in_call = torch.ones(n, dtype=torch.bool)
    call_len = torch.zeros(n, dtype=torch.long)
    for k in range(max_call_tokens):
        rows = in_call.nonzero().squeeze(1)
        if rows.numel() == 0:
            break
        scaled = last_logits[rows] / temperature
        token, logp, *spread = draw(scaled, generator, entropy)
        tokens[rows, k] = token
        token_logp[rows, k] = logp
        if entropy:
            token_entropy[rows, k] = spread[0]
        step_ids = torch.full((n, 1), pad_id, dtype=torch.long)
        step_ids[rows, 0] = token
        last_logits[rows] = sampler.step(step_ids, in_call)
        call_len += in_call
        in_call[rows] = token != end_call
    counts = call_len.tolist()
    return ([row[:c] for row, c in zip(tokens.tolist(), counts)],
            [row[:c] for row, c in zip(token_logp.tolist(), counts)],
            [row[:c] for row, c in zip(token_entropy.tolist(), counts)] if entropy else None)


def collate(trajs: list[Trajectory], pad_id: int, width: int | None = None) -> dict:
    """Right-padded batch (to `width` or the longest row): ids, attention_mask, owner [B, T]; action_mask,
    sample_logp [B, T-1]; rewards, group [B] (group index of each row, rows of a group contiguous)."""
    ids = pad_rows([t.ids for t in trajs], pad_id, width)
    lengths = torch.tensor([len(t.ids) for t in trajs])
    T = ids.shape[1]
    return {
        "ids": ids,
        "attention_mask": (torch.arange(T)[None] < lengths[:, None]).long(),
        "owner": pad_rows([t.owner for t in trajs], -1, T),
        "action_mask": pad_rows([t.action_mask for t in trajs], 0, T - 1, dtype=torch.float32),
        "sample_logp": pad_rows([t.sample_logp for t in trajs], 0.0, T - 1, dtype=torch.float32),
        "rewards": torch.tensor([t.reward for t in trajs], dtype=torch.float32),
        "group": torch.tensor([t.group for t in trajs]),
    }


def sample_groups(model, env_factory, tasks: list, tok, cfg, generator: torch.Generator,
                  temperature: float | None = None) -> list[Trajectory]:
    """`cfg.group_size` episodes per task, grouped contiguously (group i = tasks[i])."""
    envs = [env_factory(task, generator) for task in tasks for _ in range(cfg.group_size)]
    trajs = sample_episodes(model, envs, tok, generator,
                            cfg.temperature if temperature is None else temperature, cfg.max_call_tokens)
    for i, t in enumerate(trajs):
        t.group = i // cfg.group_size
    return trajs


@TASK_DRAWS.register("uniform")
def choose_tasks(tasks: list, n: int, generator: torch.Generator) -> list:
    """n distinct tasks (with repeats only when n exceeds the pool)."""
    if not tasks:
        raise ValueError("tasks: expected at least one task to sample from, got none")
    order = []
    while len(order) < n:
        order += torch.randperm(len(tasks), generator=generator, device=generator.device).tolist()
    return [tasks[i] for i in order[:n]]


@TASK_DRAWS.register("families")
def choose_by_family(tasks: list, n: int, generator: torch.Generator) -> list:
    """n distinct tasks spread over the tasks' families: rounds of one task per family, the families in a random
    order each round and each family's tasks in a random order, so a step of as many tasks as there are families has
    one of each (repeats only when n exceeds the pool). A uniform draw of 5 of the 20 training tasks (5 families of
    4) misses a family 93% of the time, one of 4 doubles a family 74% of the time; where the policy shares one
    decision (the op) across families, such a step's gradient moves it toward the families drawn."""
    if not tasks:
        raise ValueError("tasks: expected at least one task to sample from, got none")
    families: dict[str, list] = {}
    for task in tasks:
        families.setdefault(task.family, []).append(task)
    order: list = []
    while len(order) < n:
        queues = [[members[i] for i in torch.randperm(len(members), generator=generator,
                                                         device=generator.device).tolist()]
                  for members in families.values()]
        while any(queues) and len(order) < n:
            for f in torch.randperm(len(queues), generator=generator, device=generator.device).tolist():
                if queues[f] and len(order) < n:
                    order.append(queues[f].pop(0))
    return order


def choose_weighted_tasks(tasks: list, n: int, weights: list[float], generator: torch.Generator) -> list:
    """n distinct tasks drawn without replacement with probability proportional to `weights` (repeats only when n
    exceeds the pool)."""
    if not tasks:
        raise ValueError("tasks: expected at least one task to sample from, got none")
    w = torch.tensor(weights, dtype=torch.float64, device=generator.device)
    order = []
    while len(order) < n:
        order += torch.multinomial(w, len(tasks), replacement=False, generator=generator).tolist()
    return [tasks[i] for i in order[:n]]


def draw_tasks(tasks: list, n: int, generator: torch.Generator, weights: list[float] | None = None,
               draw: str = "uniform") -> list:
    """n distinct tasks: by the curriculum's `weights` when it gives them, else by TASK_DRAWS[draw]."""
    return TASK_DRAWS[draw](tasks, n, generator) if weights is None else choose_weighted_tasks(tasks, n, weights,
                                                                                                 generator)


def informative(trajs: list[Trajectory], group_size: int) -> list[Trajectory]:
    """The episodes of groups (contiguous runs of group_size) whose rewards are not all equal."""
    kept = []
    for i in range(0, len(trajs), group_size):
        rows = trajs[i:i + group_size]
        if len({t.reward for t in rows}) > 1:
            kept += rows
    return kept


@KEEP_MODES.register("all")
def keep_all(first: list[Trajectory], more, cfg) -> tuple[list, list]:
    return first, first


@KEEP_MODES.register("informative")
def keep_informative(first: list[Trajectory], more, cfg) -> tuple[list, list]:
    return informative(first, cfg.group_size), first


@KEEP_MODES.register("resample")
def keep_resample(first: list[Trajectory], more, cfg) -> tuple[list, list]:
    """DAPO dynamic sampling: keep informative groups and draw more (`more(n)` samples n further groups) until the
    batch holds tasks_per_step of them, at most resample_cap x tasks_per_step groups drawn in all. Every drawn
    episode is in `sampled`, so the dashboard counts every rollout."""
    kept, sampled = informative(first, cfg.group_size), list(first)
    drawn, cap = cfg.tasks_per_step, cfg.resample_cap * cfg.tasks_per_step
    while len(kept) < cfg.tasks_per_step * cfg.group_size and drawn < cap:
        n = min(cfg.tasks_per_step - len(kept) // cfg.group_size, cap - drawn)
        extra = more(n)
        kept += informative(extra, cfg.group_size)
        sampled += extra
        drawn += n
    return kept, sampled


def sample_step(model, env_factory, tasks: list, tok, cfg, generator: torch.Generator,
                temperature: float | None = None, weights: list[float] | None = None
                ) -> tuple[list[Trajectory], list[Trajectory]]:
    """One step's batch: `tasks_per_step` tasks (TASK_DRAWS[cfg.task_draw]: uniformly or one per family; or by
    curriculum `weights`) x `group_size` episodes.
    Returns (kept, sampled); `kept` is what the update trains on (KEEP_MODES[cfg.keep]: all groups, only informative
    ones, or informative ones topped up by further draws) and `sampled` every episode the step played."""
    chosen = draw_tasks(tasks, cfg.tasks_per_step, generator, weights, cfg.task_draw)
    sampled = sample_groups(model, env_factory, chosen, tok, cfg, generator, temperature)
    seen, drawn = {t.name for t in chosen}, [len(chosen)]

    def more(n: int) -> list[Trajectory]:
        """n more groups, from tasks this step has not drawn yet while there are any; group ids continue."""
        pool = [i for i, t in enumerate(tasks) if t.name not in seen] or list(range(len(tasks)))
        pick = draw_tasks([tasks[i] for i in pool], n, generator, None if weights is None else
                          [weights[i] for i in pool], cfg.task_draw)
        seen.update(t.name for t in pick)
        extra = sample_groups(model, env_factory, pick, tok, cfg, generator, temperature)
        for t in extra:
            t.group += drawn[0]
        drawn[0] += len(pick)
        return extra

    return KEEP_MODES[cfg.keep](sampled, more, cfg)
