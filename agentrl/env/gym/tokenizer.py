"""Word-level tokenizer over everything the gym can show: sources under every op, test lines, calls. It is also the
gym's own conversation format (agentrl.env.formats), TinyAgent's: a turn is `<call> TOOL [ARG] </call>` (`</call>`
ends it), a reply `<obs> ... </obs>`."""
from __future__ import annotations

import hashlib
import json

from agentrl.env.gym.environment import (
    CALL,
    EDITED_OBS,
    END_CALL,
    END_OBS,
    ERROR_OBS,
    NAME_POOL,
    NL,
    OBS,
    TOOLS,
    CodeEnv,
    run_tests,
    source_observation,
    test_observation,
)
from agentrl.env.ops import OPS
from agentrl.env.tasks import Task

SPECIALS = ("<pad>", "<unk>", "<bos>", CALL, END_CALL, OBS, END_OBS, NL)


class Tokenizer:
    def __init__(self, vocab: list[str]):
        if list(vocab[:len(SPECIALS)]) != list(SPECIALS):
            raise ValueError("tokenizer: vocabulary must start with the special tokens " + " ".join(SPECIALS))
        if len(set(vocab)) != len(vocab):
            raise ValueError("tokenizer: vocabulary has duplicate tokens")
        self.vocab = list(vocab)
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id = self.index["<pad>"]
        self.unk_id = self.index["<unk>"]

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, tokens: list[str] | str) -> list[int]:
        if isinstance(tokens, str):
            tokens = tokens.split()
        return [self.index.get(t, self.unk_id) for t in tokens]

    def decode(self, ids) -> str:
        return " ".join(self.vocab[int(i)] for i in ids)

    def id(self, token: str) -> int:
        return self.index[token]

    # ------------------------------------------------------------ the gym's words as a conversation format

    @property
    def stop_id(self) -> int:
        return self.index[END_CALL]

    def prompt(self, env) -> list[int]:
        return self.encode(env.reset())

    def action(self, turn: list[int]) -> list[str]:
        return [self.vocab[t] for t in turn]

    def reply(self, obs: list[str], closed: bool) -> list[int]:
        return self.encode(obs)

    def to_json(self) -> str:
        return json.dumps({"vocab": self.vocab}, indent=0) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        return cls(json.loads(text)["vocab"])

    @property
    def hash(self) -> str:
        return hashlib.sha256("\n".join(self.vocab).encode()).hexdigest()[:16]


def build_tokenizer(tasks: list[Task]) -> Tokenizer:
    """Vocabulary = specials + every token an episode on these tasks can contain, in sorted order."""
    words: set[str] = set(TOOLS) | set(OPS) | set(NAME_POOL)
    words |= set(ERROR_OBS) | set(EDITED_OBS) | {CALL, END_CALL, OBS, END_OBS, NL}
    for task in tasks:
        words |= set(CodeEnv(task, task.func).reset())
        for op in (None,) + OPS:
            words |= set(source_observation(task, op, task.func))
            words |= set(test_observation(run_tests(task, op)))
    rest = sorted(words - set(SPECIALS))
    return Tokenizer(list(SPECIALS) + rest)


def load_tokenizer(path=None) -> Tokenizer:
    """The tasks stage's tokenizer (data/tasks/tokenizer.json), with a one-line error for a bad file."""
    from agentrl.core.artifacts import TOKENIZER, StageError, read_json
    path = TOKENIZER if path is None else path
    data = read_json(path)
    try:
        if not isinstance(data, dict) or not isinstance(data.get("vocab"), list) or \
                not all(isinstance(t, str) for t in data["vocab"]):
            raise ValueError("expected {'vocab': [token, ...]}")
        return Tokenizer(data["vocab"])
    except ValueError as exc:
        raise StageError(f"{path}: not a tokenizer file ({exc}); re-run the tasks stage") from None
