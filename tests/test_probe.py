"""The op probe (agentrl.labs.probe): its numbers on hand-computed distributions, the batched teacher-forced
distribution against a row-by-row computation on a small Qwen3, the cloning callback it rides on, and the verb's
one-line refusals."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.labs import probe

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "data" / "tokenizers" / "qwen3"


def test_a_policy_that_reads_the_source_carries_information_and_one_that_ignores_it_none():
    decided = torch.tensor([[1.0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0]], dtype=torch.float64)
    out = probe.summarize(decided, [0, 1], ["minmax", "range"])
    assert out["p_oracle"] == 1.0 and out["accuracy"] == 1.0 and out["entropy"] == 0.0
    assert out["marginal"] == [0.5, 0.5, 0.0, 0.0, 0.0]
    assert out["information"] == pytest.approx(math.log(2)) and out["marginal_entropy"] == pytest.approx(math.log(2))
    prior = torch.tensor([[0.6, 0.1, 0.1, 0.1, 0.1]] * 2, dtype=torch.float64)   # the same op prior for every source
    out = probe.summarize(prior, [0, 1], ["minmax", "range"])
    h = -(0.6 * math.log(0.6) + 4 * 0.1 * math.log(0.1))                      # 1.2275 nats
    assert out["entropy"] == pytest.approx(h) and out["information"] == pytest.approx(0.0, abs=1e-12)
    assert out["p_oracle"] == pytest.approx(0.35) and out["accuracy"] == 0.5   # argmax op 0: right for minmax only
    assert out["per_family"] == {"minmax": 0.6, "range": 0.1}


def test_the_mutual_information_is_the_marginal_entropy_minus_the_mean_entropy():
    dists = torch.tensor([[0.7, 0.3, 0, 0, 0], [0.2, 0.8, 0, 0, 0]], dtype=torch.float64)
    out = probe.summarize(dists, [0, 1], ["a", "b"])
    h = lambda *p: -sum(x * math.log(x) for x in p if x > 0)
    assert out["entropy"] == pytest.approx((h(0.7, 0.3) + h(0.2, 0.8)) / 2)
    assert out["information"] == pytest.approx(h(0.45, 0.55) - (h(0.7, 0.3) + h(0.2, 0.8)) / 2)
    assert out["p_oracle"] == pytest.approx(0.75)


def test_grpos_change_is_paired_over_the_same_tasks():
    dists = torch.tensor([[0.2, 0.8, 0, 0, 0], [0.4, 0.6, 0, 0, 0], [0.6, 0.4, 0, 0, 0]], dtype=torch.float64)
    before = probe.summarize(dists, [0, 0, 1], ["f", "f", "g"], ["f/a", "f/a", "g/b"])
    assert before["per_task"] == pytest.approx({"f/a": 0.3, "g/b": 0.4})   # a task's contexts averaged first
    after = {"per_task": {"f/a": 0.6, "g/b": 0.4}}
    got = probe.change(before, after, seed=0)
    assert got["mean"] == pytest.approx(0.15) and got["tasks"] == 2
    assert got["lo"] == pytest.approx(0.0) and got["hi"] == pytest.approx(0.3)   # the differences are 0.3 and 0
    with pytest.raises(ValueError, match="different tasks"):
        probe.change(before, {"per_task": {"f/a": 0.6}}, seed=0)


def test_cloning_calls_back_after_every_step_with_its_loss(monkeypatch):
    import agentrl.starting.tinyagent as t
    seen = []
    monkeypatch.setattr(t, "collate", lambda trajs, pad: {})
    monkeypatch.setattr(t, "sft_step", lambda *args: float(len(seen)))   # the step itself is tested elsewhere
    losses = t.train_sft(torch.nn.Linear(1, 1), [object()], type("Tok", (), {"pad_id": 0})(), 3, 1e-3,
                         on_step=lambda step, loss: seen.append((step, loss)))
    assert seen == [(1, 0.0), (2, 1.0), (3, 2.0)] and losses == [0.0, 1.0, 2.0]


@pytest.mark.slow
@pytest.mark.usefixtures("qwen3_tokenizer")
def test_the_batched_op_distribution_equals_each_turn_scored_alone(tmp_path):
    """The five edit turns are scored in one right-padded batch; each must equal its own unpadded row (a shifted
    mask or a padded position read as the turn would not)."""
    from agentrl.backends.hf import make_small_model, transformers
    from agentrl.env.gym.chat import GymToolChat
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.env.ops import REPAIR_OPS
    from agentrl.env.tasks import make_tasks
    chat = GymToolChat(transformers().AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True))
    model = make_small_model(tmp_path / "m", torch.Generator().manual_seed(0), TOKENIZER)
    contexts = probe.read_contexts(chat, make_tasks("heldout")[:2], make_env_factory(5, "hidden", True), 1,
                                   torch.Generator().manual_seed(0))
    assert len(contexts) == 2 and contexts[0][0].name == "minmax/peak"
    task, ctx = contexts[0]
    got = probe.op_distribution(model, chat, ctx)
    with torch.no_grad():
        scores = []
        for op in REPAIR_OPS:
            turn = chat.turn_ids("edit", {"op": op})
            ids = torch.tensor([ctx + turn])
            logp, _ = model.log_probs(ids)
            scores.append(float(logp[0, len(ctx) - 1:].sum()))
    want = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
    assert torch.allclose(got, want, atol=1e-5), (got, want)
    out = probe.op_probe(model, chat, contexts)
    assert out["contexts"] == 2 and 0.0 <= out["information"] <= math.log(5) + 1e-9
    assert model.training   # the probe leaves the model in the mode it found


def _run(*args):
    return subprocess.run([sys.executable, "-m", "agentrl", "opprobe", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow   # a CLI subprocess each (the verb's imports: torch, transformers)
@pytest.mark.parametrize("args, message", [
    (["--lab", "smollm2"], "error: opprobe: name a --checkpoint, --clone-curve or --table"),
    (["--lab", "smollm2", "--clone-curve", "16", "--every", "32"],
     "error: opprobe: --every (32) must be at most --clone-curve (16)"),
    (["--lab", "chess", "--checkpoint", "final"], "error: --lab: unknown value 'chess'; allowed: menu, "),
    (["--lab", "tools", "--checkpoint", "final"], "error: opprobe: lab tools runs the coding environment; the op "
                                                  "probe is defined for gym"),
    (["--lab", "smollm2", "--checkpoint", "cold"],
     "error: python -m agentrl opprobe: argument --checkpoint: invalid choice"),
])
def test_bad_opprobe_arguments_are_one_line_before_any_model_loads(args, message):
    res = _run(*args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(message) and res.stderr.count("\n") == 1, res.stderr


def test_the_table_reads_the_recorded_probes(tmp_path, monkeypatch):
    from agentrl.labs.instance import LabInstance
    monkeypatch.chdir(tmp_path)
    inst = LabInstance("lab", 1, {})
    side = lambda p: {"p_oracle": p, "accuracy": 0.5, "entropy": 1.0, "information": 0.05}
    row = lambda step, p: {"step": step, "heldout": side(p), "train": side(p + 0.1)}
    assert probe.probe_path(inst).as_posix() == "reports/labs/lab/seed1.probe.json"
    probe.probe_path(inst).parent.mkdir(parents=True)
    probe.probe_path(inst).write_text(json.dumps({
        "clone_curve": {"rows": [row(32, 0.238), row(128, 0.445)]},
        "checkpoints": {"final": {"heldout": side(0.5), "train": side(0.6)}}}))
    text = probe.table(inst)
    assert "| 32 | 0.238 | 0.50 | 1.000 | 0.050 | 0.338 |" in text
    assert "| 128 | 0.445 |" in text and "| final | 0.500 | 0.50 | 1.000 | 0.050 | 0.600 |" in text
    with pytest.raises(Exception, match="opprobe --table: reports/labs/lab/seed2.probe.json does not exist yet"):
        probe.table(LabInstance("lab", 2, {}))
