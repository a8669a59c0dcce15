"ablate: interventions, scores, core_dims, baselines."
import pytest
import torch
from torch import nn

from coreinv.ablate import (ablate, class_means_core, core_dims, hook_evaluator, necessity, pca_core,
                            probe_core, random_core, sufficiency)
from coreinv.ace import ACE, Core

F64 = torch.float64


def test_scores():
    assert sufficiency(1.0, 1.0, 0.5) == 1 and sufficiency(0.5, 1.0, 0.5) == 0
    assert necessity(0.5, 1.0, 0.5) == 1 and necessity(1.0, 1.0, 0.5) == 0
    assert abs(sufficiency(0.01, 0.0, 0.2) - 0.95) < 1e-12          # lower-is-better metrics too
    with pytest.raises(ValueError):
        necessity(0.1, 0.3, 0.3)


def _planted():
    g = torch.Generator().manual_seed(0)
    Q = torch.linalg.qr(torch.randn(10, 5, generator=g))[0]
    S, R = Q[:, :2], Q[:, 2:]
    E = torch.cat([S, 2 * R], 1)                                   # [10, 5]
    V = torch.randn(4, 2, generator=g)

    class Read(nn.Module):
        def forward(self, h): return torch.tanh(h @ S) @ V.T
    net = nn.Sequential(nn.Linear(5, 10, bias=False), Read())
    with torch.no_grad(): net[0].weight.copy_(E)
    return net, S, torch.randn(20000, 5, generator=g)


def test_ablate_module_and_core_dims():
    net, S, xs = _planted()
    with torch.no_grad(): p = net(xs).softmax(-1)
    kl = lambda logits, x: (p * (p.log() - logits.log_softmax(-1))).sum(-1).mean()
    chance = float(kl(p.mean(0).log().expand_as(p), xs))
    ev = hook_evaluator(net, "0", xs, kl)
    intact = ev(None)
    ace = ACE(batch_size=5000).fit_hook(net, xs, "0", lambda o, x: o.log_softmax(-1))
    dims = core_dims(ev, ace, [1, 2], intact, chance)
    assert dims.k_sufficient == 2 and dims.k_necessary == 2
    rnd = core_dims(ev, lambda k: random_core(10, k, torch.zeros(10)), [1, 2], intact, chance)
    assert rnd.k_sufficient is None
    with torch.no_grad():
        with ablate(net, "0", ace.core(2), "remove"):
            out = net(xs)
    assert out.std(0).max() < 0.2 * net(xs).std(0).max()               # removal flattens the output
    assert torch.equal(net(xs), net(xs))                                # hook removed


def test_ablate_transformer_lens_positions():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        model = HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4,
                                                          n_heads=2, d_vocab=5, act_fn="relu", seed=0)).eval()
    toks = torch.randint(0, 5, (3, 4), generator=torch.Generator().manual_seed(0))
    hook = "blocks.0.hook_resid_mid"
    with torch.no_grad():
        base = model(toks)
        with ablate(model, hook, Core(torch.eye(8), torch.zeros(8)), "remove", pos=1):
            out = model(toks)
    assert torch.allclose(out[:, 0], base[:, 0]) and not torch.allclose(out[:, 1], base[:, 1])
    with pytest.raises(ValueError, match="close names"):
        with ablate(model, "blocks.0.hook_resid_md", Core(torch.eye(8), torch.zeros(8))):
            pass


def test_baselines_are_orthonormal_cores():
    g = torch.Generator().manual_seed(0)
    acts = torch.randn(500, 6, generator=g, dtype=F64) * torch.arange(1, 7, dtype=F64)
    labels = (acts[:, 0] > 0).long() + (acts[:, 1] > 0).long()
    for c in [random_core(6, 3, acts.mean(0)), pca_core(acts, 3), class_means_core(acts, labels),
              probe_core(acts, labels, 2)]:
        assert isinstance(c, Core)
        assert torch.allclose(c.basis.T @ c.basis, torch.eye(c.k, dtype=F64), atol=1e-10)
    assert pca_core(acts, 1).basis[:, 0].abs().argmax() == 5          # largest variance
    assert class_means_core(acts, labels).k == 2                       # 3 classes → 2 directions
    with pytest.raises(ValueError):
        pca_core(acts, 7)
    with pytest.raises(ValueError):
        class_means_core(acts, labels[:-1])
