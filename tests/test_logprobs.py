"""agentrl.model.logprobs on a 151,936-entry vocabulary (Qwen3's): the log-softmax, the selected log-probs and the
entropy are float32-accurate against float64, where PyTorch's fused float32 log_softmax is off by ~1e-4; one draw
follows softmax(logits); and a small vocabulary keeps the fused kernel and torch.multinomial bit for bit (TinyAgent's
committed numbers were made with them)."""
import pytest
import torch
import torch.nn.functional as F

from agentrl.model.logprobs import (
    FUSED_LOG_SOFTMAX_MAX_VOCAB,
    draw,
    entropy_from_logits,
    log_softmax,
    selected_log_probs,
)

QWEN3_VOCAB = 151_936


@pytest.fixture(scope="module")
def large_logits():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(16, QWEN3_VOCAB, generator=g) * 1.5
    z[:, 0] += 14.0   # peaky rows, as a trained policy's
    return z


def test_the_fused_float32_kernel_is_off_on_a_large_vocabulary_and_ours_is_not(large_logits):
    exact = F.log_softmax(large_logits.double(), dim=-1)
    fused = (F.log_softmax(large_logits, dim=-1).double() - exact).abs().max()
    ours = (log_softmax(large_logits).double() - exact).abs().max()
    assert fused > 2e-5            # the reason for the large-vocabulary path (measured ~1.9e-4 here)
    assert ours < 5e-6
    targets = torch.randint(QWEN3_VOCAB, (16,), generator=torch.Generator().manual_seed(1))
    picked = selected_log_probs(large_logits, targets).double()
    assert (picked - exact.gather(1, targets[:, None]).squeeze(1)).abs().max() < 5e-6
    p = exact.exp()
    assert (entropy_from_logits(large_logits).double() + (p * exact).sum(-1)).abs().max() < 1e-4


def test_a_small_vocabulary_keeps_the_fused_kernel_and_draws_by_the_softmax_cdf():
    """One uniform per row against the running sum of softmax's float64 probabilities: the token is the first whose
    running sum exceeds u * total (found here by a plain Python scan), its log-prob the fused log-softmax's."""
    z = torch.randn(8, FUSED_LOG_SOFTMAX_MAX_VOCAB, generator=torch.Generator().manual_seed(2))
    assert torch.equal(log_softmax(z), F.log_softmax(z, dim=-1))
    token, logp = draw(z, torch.Generator().manual_seed(3))
    u = torch.rand(8, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    probs = F.softmax(z.double(), dim=-1).tolist()
    for row in range(8):
        running, total = 0.0, sum(probs[row])
        target = float(u[row]) * float(torch.tensor(probs[row], dtype=torch.float64).cumsum(0)[-1])
        last = len(probs[row]) - 1
        first = next(t for t, p in enumerate(probs[row]) if (running := running + p) > target or t == last)
        assert abs(total - 1.0) < 1e-9 and int(token[row]) == first, (row, int(token[row]), first)
    assert torch.equal(logp, F.log_softmax(z, dim=-1).gather(1, token[:, None]).squeeze(1))


def test_a_small_vocabulary_draw_follows_the_softmax():
    z = torch.tensor([[0.0, 1.0, -1.0, -30.0]])
    p = torch.softmax(z.double(), dim=-1)[0]
    n = 20_000
    tokens, _ = draw(z.expand(n, -1), torch.Generator().manual_seed(5))
    for t in range(4):
        share = float((tokens == t).double().mean())
        sigma = (float(p[t]) * (1 - float(p[t])) / n) ** 0.5
        assert abs(share - float(p[t])) < 4 * sigma + 1e-9, (t, share, float(p[t]))


def test_a_large_vocabulary_draw_follows_the_softmax_and_returns_its_log_prob():
    V = 4 * FUSED_LOG_SOFTMAX_MAX_VOCAB    # the large-vocabulary path, at a size a unit test can draw from often
    z = torch.full((1, V), -30.0)
    z[0, [3, 7_000, V - 1]] = torch.tensor([0.0, 1.0, -1.0])   # p ~ 0.245, 0.665, 0.090
    z[0, 500:1500] = -2.0                                                 # a tail of 1000 entries, ~0.0 each
    p = torch.softmax(z.double(), dim=-1)[0]
    g = torch.Generator().manual_seed(4)
    n = 4_000
    tokens, logps = zip(*(draw(z.expand(500, -1), g) for _ in range(n // 500)))
    tokens, logps = torch.cat(tokens), torch.cat(logps)
    for t in (3, 7_000, V - 1):
        share = float((tokens == t).double().mean())
        sigma = (float(p[t]) * (1 - float(p[t])) / n) ** 0.5
        assert abs(share - float(p[t])) < 4 * sigma, (t, share, float(p[t]))
    tail = float(((tokens >= 500) & (tokens < 1500)).double().mean())
    assert abs(tail - float(p[500:1500].sum())) < 4 * (float(p[500:1500].sum()) / n) ** 0.5 + 1e-3
    assert (logps.double() - p.log()[tokens]).abs().max() < 1e-6
    assert not ((tokens >= 1500) & (tokens < 7_000)).any()   # entries of probability ~1e-14 are never drawn here
