"coreinv.das: the interchange intervention and DAS on a toy model with a planted direction, and its twin."
import pytest
import torch
from torch import nn

from coreinv.base import Core
from coreinv.das import fit_das, interchange
from coreinv.models import last_position


class Toy(nn.Module):
    "Token → hidden (class ±1 along `w`, class-free token features ⟂ w) → two logits reading only the class."
    def __init__(self, d=12, n_tokens=8, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.linalg.qr(torch.randn(d, d, generator=g))[0][:, 0]
        noise = torch.randn(n_tokens // 2, d, generator=g).repeat_interleave(2, 0)
        noise -= (noise @ self.w)[:, None] * self.w
        cls = torch.arange(n_tokens) % 2 * 2.0 - 1
        self.embed = nn.Embedding.from_pretrained(noise + cls[:, None] * self.w)
        self.mix = nn.Identity()

    def forward(self, tokens):
        z = self.mix(self.embed(tokens)) @ self.w
        return torch.stack([z, -z], -1)


def batches(m, n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(3):
        b = torch.randint(0, 8, (n, 3), generator=g)
        s = b.clone()
        s[:, -1] = (b[:, -1] + 2 * torch.randint(0, 4, (n,), generator=g) + 1) % 8     # the other class
        out.append((b, m.embed(s)[:, -1].detach(), (1 - s[:, -1] % 2).long()))
    return out


xent = lambda logits, t: nn.functional.cross_entropy(logits[:, -1], t)


def iia(m, U, bs):
    with torch.no_grad():
        return float(torch.cat([(m_out[:, -1].argmax(-1) == t) for b, s, t in bs
                                for m_out in [_run(m, U, b, s)]]).float().mean())


def _run(m, U, b, s):
    with interchange(m, "mix", U, s):
        return m(b)


@pytest.mark.parametrize("seed", [0, 1])
def test_das_finds_the_planted_direction_and_the_twin_its_own(seed):
    m = Toy(seed=seed)
    core = fit_das(m, "mix", batches(m), xent, steps=150, lr=0.05, seed=seed)
    assert abs(float(core.basis[:, 0] @ m.w.double())) > 0.99
    test = batches(m, seed=7)
    assert iia(m, core, test) == 1.0
    other = torch.linalg.qr(torch.stack([m.w, torch.ones(12)], 1))[0][:, 1:]        # ⟂ w: nothing moves
    assert iia(m, other, test) == 0.0
    twin = Toy(seed=seed + 5)
    assert abs(float(core.basis[:, 0] @ twin.w.double())) < 0.9


def test_interchange_ignores_the_sign_and_the_basis_of_the_subspace():
    m = Toy()
    b, s, _ = batches(m)[0]
    U = torch.linalg.qr(torch.randn(12, 2, generator=torch.Generator().manual_seed(0)))[0]
    R = torch.linalg.qr(torch.randn(2, 2, generator=torch.Generator().manual_seed(1)))[0]
    with torch.no_grad():
        a, c, d = _run(m, U, b, s), _run(m, U @ R, b, s), _run(m, -U, b, s)
    assert torch.allclose(a, c, atol=1e-5) and torch.allclose(a, d, atol=1e-6)
    assert torch.equal(_run(m, Core(U.double(), torch.zeros(12)), b, s), a)


def test_fit_das_returns_a_core_and_leaves_the_model_alone():
    m = Toy()
    before = m.embed.weight.clone()
    core = fit_das(m, "mix", batches(m), xent, k=2, steps=5)
    assert isinstance(core, Core) and core.k == 2 and core.d == 12
    assert torch.allclose(core.basis.T @ core.basis, torch.eye(2, dtype=torch.float64), atol=1e-10)
    assert torch.equal(m.embed.weight, before)
    again = fit_das(m, "mix", batches(m), xent, k=2, steps=5)
    assert torch.equal(core.basis, again.basis)                                      # seeded


def test_bad_input_names_the_cause():
    m = Toy()
    bs = batches(m)
    with pytest.raises(ValueError, match="at least one batch"):
        fit_das(m, "mix", [], xent)
    with pytest.raises(ValueError, match="1 ≤ k ≤ D"):
        fit_das(m, "mix", bs, xent, k=13)
    with pytest.raises(ValueError, match="same width"):
        fit_das(m, "mix", [bs[0], (bs[1][0], bs[1][1][:, :5], bs[1][2])], xent)
    with pytest.raises(ValueError, match="source has shape"):
        _run(m, m.w[:, None], bs[0][0], bs[0][1][:3])
    with pytest.raises(ValueError, match="basis must be"):
        with interchange(m, "mix", m.w, bs[0][1]):
            pass


def test_last_position_gives_the_last_logits_of_a_model_with_an_unembedding():
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.unembed = nn.Embedding(5, 4), nn.Linear(4, 5)
        def forward(self, t): return self.unembed(self.embed(t))
    lm, t = LM(), torch.tensor([[1, 2, 3], [0, 4, 4]])
    with torch.no_grad(), last_position(lm):
        last = lm(t)
    assert last.shape == (2, 1, 5) and torch.allclose(last[:, -1], lm(t)[:, -1])
    assert lm(t).shape == (2, 3, 5)
    with pytest.raises(ValueError, match="no `unembed`"):
        with last_position(nn.Linear(2, 2)):
            pass
