"""The small SAE of coreinv.sae and its use as a Koopman dictionary."""
import numpy as np
import pytest
import torch

from coreinv.dictionaries import SAEDictionary
from coreinv.koopman import EDMDc, linear_control_system
from coreinv.sae import SAE, sae_metrics, train_sae


def sparse_data(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    true = rng.standard_normal((10, 12)); true /= np.linalg.norm(true, axis=1, keepdims=True)
    codes = rng.exponential(1.0, (n, 10)) * (rng.random((n, 10)) < 0.2)
    return 5.0 * codes @ true + 3.0, true                                 # scaled and offset on purpose


def test_sae_learns_sparse_features_at_any_scale():
    X, true = sparse_data()
    sae = train_sae(X, d_sae=20, steps=500, seed=0)
    met = sae_metrics(sae, X)
    assert met["explained_variance"] > 0.95 and met["l0"] < 5
    W = sae.W_dec.detach().numpy()
    cos = np.abs(true @ (W / np.linalg.norm(W, axis=1, keepdims=True)).T).max(1)
    assert np.median(cos) > 0.95


def test_deterministic_and_shapes():
    X, _ = sparse_data(500)
    a, b = train_sae(X, 8, steps=20, seed=3), train_sae(X, 8, steps=20, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    f = a.encode(torch.as_tensor(X[:4], dtype=torch.float32))
    assert f.shape == (4, 8) and (f >= 0).all() and a.decode(f).shape == (4, 12)
    with pytest.raises(ValueError, match="NaN"):
        train_sae(np.full((10, 3), np.nan), 4, steps=2)


def test_sae_as_dictionary_in_edmdc():
    A, B, X, U, Y = linear_control_system(1000)
    sae = train_sae(np.vstack([X, Y]), 12, steps=200)
    m = EDMDc(SAEDictionary(sae, 5, select="frequency")).fit(X, U, Y)
    assert m.A_.shape == (6, 6) and m.C_.shape == (4, 6) and np.isfinite(m.eigvals_).all()
    assert isinstance(SAE(3, 5), torch.nn.Module)
