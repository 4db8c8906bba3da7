"""The labs' cold start: the scripted expert's conversations rendered through the model's own chat template (Qwen3's,
SmolLM2's ChatML), behaviour-cloned.

A model that has not seen these tools cannot call them, so, as TinyAgent's start, it first clones a scripted expert.
The expert (agentrl.env.gym.callers.ExpertCaller: read, edit with the keyword rule's op, test, submit) is played
through the real gym; each of its calls becomes the ids a well-formed turn has
(`<tool_call>...</tool_call><|im_end|>`, the chat format's `turn_ids`) and each observation the template's
tool-response block (`reply`), so the demonstration is exactly the token sequence the policy would have produced and
read: prompt, policy turns and environment blocks, appended, never re-rendered. Cloning is the project's hard-target
SFT (agentrl.starting.tinyagent.train_sft) through the backend interface.
"""
from __future__ import annotations

import torch

from agentrl.env.gym.callers import ExpertCaller, call_tokens
from agentrl.env.gym.environment import CALL, END_CALL
from agentrl.env.ops import REPAIR_OPS
from agentrl.rl.rollout import OWNER, Trajectory
from agentrl.starting.tinyagent import train_sft


def call_arguments(call: list[str]) -> tuple[str, dict]:
    """The gym's call words `<call> edit fix_range </call>` -> ("edit", {"op": "fix_range"})."""
    assert call[0] == CALL and call[-1] == END_CALL, call
    body = call[1:-1]
    return body[0], ({"op": body[1]} if len(body) > 1 else {})


def expert_demo(env, chat, caller=None) -> Trajectory:
    """One scripted-expert episode of `env` as a trajectory in the chat format (hard targets)."""
    caller = caller or ExpertCaller()
    ids = chat.prompt(env)
    owner = [OWNER["prompt"]] * len(ids)
    obs = None
    while not env.done:
        call = caller(obs)
        turn = chat.turn_ids(*call_arguments(call))
        ids += turn
        owner += [OWNER["policy"]] * len(turn)
        obs = env.step(chat.action(turn))
        if obs is not None:
            reply = chat.reply(obs, closed=True)
            ids += reply
            owner += [OWNER["env"]] * len(reply)
    return Trajectory(ids, owner, [0.0] * (len(ids) - 1), env.reward, env.record())


class FormatCaller(ExpertCaller):
    """The expert's calls (read, edit, test, submit) with the op drawn uniformly from the repair ops: demonstrations
    of the format that leave the decision to the reward."""

    def __init__(self, generator: torch.Generator):
        super().__init__()
        self.generator = generator

    def __call__(self, obs):
        call = super().__call__(obs)
        if self.turn == 2:
            self.op = REPAIR_OPS[int(torch.randint(len(REPAIR_OPS), (1,), generator=self.generator,
                                                   device=self.generator.device))]
            call = call_tokens("edit", self.op)
        return call


def format_demo(env, chat, generator: torch.Generator) -> Trajectory:
    """One format-only episode (FormatCaller) as a trajectory in the chat format."""
    return expert_demo(env, chat, FormatCaller(generator))


def expert_demos(tasks: list, chat, env_factory, per_task: int, generator: torch.Generator) -> list[Trajectory]:
    return [expert_demo(env_factory(task, generator), chat) for task in tasks for _ in range(per_task)]


def clone(model, demos: list[Trajectory], chat, steps: int, lr: float, batch_size: int,
          generator: torch.Generator, on_step=None) -> list[float]:
    """`steps` Adam steps of cross-entropy on the demonstrations' policy tokens (batches drawn with the generator);
    on_step(step, loss) after each (agentrl.labs.probe's clone curve)."""
    model.train()
    return train_sft(model, demos, chat, steps, lr, batch_size, generator, on_step=on_step)


def tools_expert_demo(env, chat) -> Trajectory:
    """One episode of the generic-tools expert (agentrl.env.coding.expert: Read, Edit with whole lines, pytest, answer)
    in the chat format: each call as a well-formed turn, the answer as a turn without a tool call."""
    from agentrl.env.coding.expert import expert_calls
    ids = chat.prompt(env)
    owner = [OWNER["prompt"]] * len(ids)
    for action in expert_calls(env.task, env.name, env.operands):
        if env.done:
            break
        if "answer" in action:
            turn = chat.answer_ids(action["answer"])
        else:
            turn = chat.turn_ids(action["name"], action["arguments"])
        ids += turn
        owner += [OWNER["policy"]] * len(turn)
        obs = env.step(chat.action(turn))
        if obs is not None:
            reply = chat.reply(obs, closed=True)
            ids += reply
            owner += [OWNER["env"]] * len(reply)
    return Trajectory(ids, owner, [0.0] * (len(ids) - 1), env.reward, env.record())
