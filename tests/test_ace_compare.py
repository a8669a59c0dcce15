"compare: overlaps, CCA, alignment, weight cosine, Spearman."
import numpy as np
import pytest
import torch
from torch import nn

from coreinv.compare import cca, cca_align, procrustes, projector_overlap, spearman, weight_cosine

F64 = torch.float64


def test_projector_overlap():
    g = torch.Generator().manual_seed(0)
    U = torch.linalg.qr(torch.randn(20, 3, generator=g, dtype=F64))[0]
    G = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=F64))[0]
    assert abs(projector_overlap(U, U @ G) - 1) < 1e-12
    E = torch.eye(20, dtype=F64)
    assert projector_overlap(E[:, :3], E[:, 3:6]) == 0
    vals = [projector_overlap(*(torch.linalg.qr(torch.randn(20, 3, generator=g, dtype=F64))[0] for _ in range(2)))
            for _ in range(400)]
    assert abs(np.mean(vals) - 3 / 20) < 0.02
    with pytest.raises(ValueError):
        projector_overlap(torch.ones(20, 2), U)


def test_cca_invertible_map_and_noise():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2000, 3, generator=g, dtype=F64)
    M = torch.randn(3, 3, generator=g, dtype=F64)
    assert torch.allclose(cca(X, X @ M - 1), torch.ones(3, dtype=F64), atol=1e-10)
    assert cca(X, torch.randn(2000, 3, generator=g, dtype=F64)).max() < 0.1
    with pytest.raises(ValueError):
        cca(X[:5], X[:5])
    with pytest.raises(ValueError):
        cca(X, X[:-1])


def test_alignment_maps():
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(300, 3, generator=g, dtype=F64)
    R = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=F64))[0]
    Rh, res = procrustes(Z, Z @ R + 2)
    assert torch.allclose(Rh, R, atol=1e-10) and res < 1e-10
    L = torch.randn(3, 3, generator=g, dtype=F64)
    A, B, c = cca_align(Z, Z @ L)
    assert torch.allclose((Z - Z.mean(0)) @ A, (Z @ L - (Z @ L).mean(0)) @ B, atol=1e-8)


def test_weight_cosine():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(30, 30), nn.LayerNorm(30))
    b = nn.Sequential(nn.Linear(30, 30), nn.LayerNorm(30))
    assert abs(weight_cosine(a, a) - 1) < 1e-12
    assert weight_cosine(a, b) > weight_cosine(a, b, matrices_only=True) + 0.2   # LayerNorm gains inflate it
    with pytest.raises(ValueError):
        weight_cosine(a, nn.Linear(30, 30))


def test_spearman():
    rng = np.random.default_rng(0)
    x = rng.normal(size=100)
    assert spearman(x, x ** 3)[0] == 1.0
    rho, (lo, hi) = spearman(x, x + rng.normal(size=100))
    assert lo < rho < hi
    with pytest.raises(ValueError):
        spearman(x, x[:-1])
    with pytest.raises(ValueError):
        spearman(np.ones(10), x[:10])
