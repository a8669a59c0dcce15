"""The dictionaries of coreinv.dictionaries: one interface, constants, SAE duck typing, spectral."""
import inspect

import numpy as np
import pytest
import torch

from coreinv.dictionaries import (IdentityDictionary, PCADictionary, RandomFourierDictionary,
                                  RandomProjectionDictionary, SAEDictionary, SpectralDictionary)
from coreinv.koopman import EDMDc, linear_control_system
from coreinv.spectra import invariance_residual, spectral_distance

A, B, X, U, Y = linear_control_system(1000, seed=0)


class Enc(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.W = torch.nn.Parameter(torch.randn(4, 20, generator=g, dtype=torch.float64))
        self.b = torch.nn.Parameter(-torch.linspace(0, 3, 20, dtype=torch.float64))
    def encode(self, x): return torch.relu(x @ self.W + self.b)


class SaeLensLike:
    "Only what a sae-lens SAE offers that we use: encode, dtype, device (no torch.nn.Module)."
    def __init__(self):
        self.enc, self.dtype, self.device = Enc(), torch.float64, torch.device("cpu")
        self.calls = []
    def encode(self, x):
        self.calls.append(x.dtype)
        return self.enc.encode(x)


ALL = [IdentityDictionary(), PCADictionary(3), RandomProjectionDictionary(2), RandomFourierDictionary(16),
       SAEDictionary(Enc(), 5)]


@pytest.mark.parametrize("d", ALL, ids=lambda d: type(d).__name__)
def test_interface_and_constant(d):
    assert d.fit(X) is d
    F = d.transform(X)
    assert F.shape == (len(X), d.n_features_) and d.has_constant_ and np.all(F[:, 0] == 1)
    assert np.array_equal(d.fit_transform(X), F)
    assert np.allclose(d.transform(X[:7]), F[:7], rtol=0, atol=1e-12)   # row-wise features
    with pytest.raises(ValueError, match="fitted on D=4"):
        d.transform(X[:, :3])


@pytest.mark.parametrize("cls,args", [(IdentityDictionary, ()), (PCADictionary, (2,)),
                                      (RandomProjectionDictionary, (2,)), (RandomFourierDictionary, (8,))])
def test_no_constant_and_unfitted(cls, args):
    d = cls(*args, constant=False)
    with pytest.raises(ValueError, match="call fit first"):
        d.transform(X)
    F = d.fit(X).transform(X)
    assert not d.has_constant_ and not np.allclose(F[:, 0], 1)


def test_pca_and_random_projection_closed_forms():
    p = PCADictionary(2, constant=False).fit(X)
    C = np.cov(X.T)
    w, V = np.linalg.eigh(C)
    assert np.allclose(np.abs(p.components_.T @ V[:, ::-1][:, :2]), np.eye(2), atol=1e-8)
    q = RandomProjectionDictionary(3, seed=1, constant=False).fit(X)
    assert np.allclose(q.components_.T @ q.components_, np.eye(3))
    assert not np.allclose(q.components_, RandomProjectionDictionary(3, seed=2).fit(X).components_)
    with pytest.raises(ValueError, match="n_components"):
        RandomProjectionDictionary(5).fit(X)


def test_random_fourier_median_heuristic_and_kernel():
    from scipy.spatial.distance import pdist
    rng = np.random.default_rng(0)
    Z = rng.standard_normal((300, 3)) * 3.0
    d = RandomFourierDictionary(5000, constant=False).fit(Z)
    assert d.bandwidth_ == pytest.approx(np.median(pdist(Z)), rel=1e-12)
    F = d.transform(Z[:20])
    K = np.exp(-pdist(Z[:20], "sqeuclidean") / (2 * d.bandwidth_ ** 2))
    assert np.abs(pdist(F, lambda a, b: a @ b) - K).max() < 0.1
    assert np.abs(d.transform(Z)).max() <= np.sqrt(2 / 5000) + 1e-15          # bounded features


def test_sae_dictionary_duck_typed_and_selection_rules():
    lens = SaeLensLike()
    dv = SAEDictionary(lens, 6, select="variance").fit(X)
    df = SAEDictionary(lens, 6, select="frequency").fit(X)
    assert set(lens.calls) == {torch.float64}                             # called in the SAE's dtype
    Z = lens.enc.encode(torch.as_tensor(X)).detach().numpy()
    assert list(dv.latents_) == list(np.argsort(-Z.var(0), kind="stable")[:6])
    assert list(df.latents_) == list(np.argsort(-(Z > 0).mean(0), kind="stable")[:6])
    assert list(dv.latents_) != list(df.latents_)                         # the rule matters here
    assert np.allclose(dv.transform(X)[:, 1:], Z[:, dv.latents_])
    # a plain callable works too
    dc = SAEDictionary(lambda x: torch.relu(x), 2).fit(X)
    assert np.allclose(dc.transform(X)[:, 1:], np.maximum(X, 0)[:, dc.latents_], atol=1e-6)
    with pytest.raises(ValueError, match="select"):
        SAEDictionary(lens, 3, select="norm").fit(X)
    with pytest.raises(ValueError, match="n_components"):
        SAEDictionary(lens, 21).fit(X)


def test_spectral_dictionary_recovers_eigenfunctions():
    sp = SpectralDictionary(4, base=IdentityDictionary(constant=False), rank=4, ridge=0.0, constant=False)
    sp.fit(X, (U, Y))
    assert spectral_distance(sp.eigvals_, np.linalg.eigvals(A)) < 1e-10
    assert invariance_residual(sp, X, U, Y, fit_dictionary=False).overall < 1e-20
    F = sp.transform(X)
    assert np.allclose(np.sqrt((F ** 2).mean(0)), 1)                     # unit-RMS features
    # fitted through EDMDc (which passes the dynamics), with a constant
    m = EDMDc(SpectralDictionary(4, base=IdentityDictionary(constant=False), rank=4, ridge=0.0)).fit(X, U, Y)
    assert m.dictionary_.has_constant_ and spectral_distance(m, list(np.linalg.eigvals(A)) + [1.0]) < 1e-8
    with pytest.raises(ValueError, match="needs the dynamics"):
        SpectralDictionary(2).fit(X)
    # never splits a complex pair: asking for 3 gives the pair and the next real eigenvalue
    s3 = SpectralDictionary(3, base=IdentityDictionary(constant=False), rank=4, ridge=0.0).fit(X, (U, Y))
    assert s3.n_features_ == 4 and np.iscomplex(s3.eigvals_[:2]).all() and s3.eigvals_[2].imag == 0


def test_user_dictionary_object():
    class Mine:
        def fit(self, X): self.fitted = True; return self
        def transform(self, X): return np.hstack([np.ones((len(X), 1)), X])
    mine = Mine()
    m = EDMDc(mine).fit(X, U, Y)
    assert not hasattr(mine, "fitted") and m.dictionary_.fitted            # the user's object is untouched
    assert spectral_distance(m, EDMDc(IdentityDictionary()).fit(X, U, Y)) < 1e-10


def test_estimator_contract_and_clone_without_deepcopy():
    from coreinv.base import clone
    m = EDMDc(SpectralDictionary(4, base=RandomFourierDictionary(32, seed=2)), rank=None, ridge=0.1)
    p = m.get_params()
    assert p["ridge"] == 0.1 and p["dictionary__n_components"] == 4 and p["dictionary__base__seed"] == 2
    m.set_params(dictionary__base__seed=5, chunk=100)
    assert m.dictionary.base.seed == 5 and m.chunk == 100
    with pytest.raises(ValueError, match="no parameter 'rnk'"):
        m.set_params(rnk=3)
    c = clone(m.fit(X, U, Y))
    assert c.get_params(deep=False).keys() == m.get_params(deep=False).keys()
    assert c.dictionary is not m.dictionary and c.dictionary.base is not m.dictionary.base
    assert not hasattr(c, "A_") and not hasattr(c.dictionary, "weights_")
    assert not hasattr(m.dictionary, "weights_")          # EDMDc fits a clone, never the caller's dictionary
    sae = SAEDictionary(Enc(), 5)
    assert clone(sae).encoder is sae.encoder              # a model parameter is shared, not copied
    assert repr(PCADictionary(3)) == "PCADictionary(n_components=3)"
    assert repr(PCADictionary(3, constant=False)) == "PCADictionary(n_components=3, constant=False)"


def test_spectral_dictionary_keeps_the_fit_signature():
    base = IdentityDictionary(constant=False)
    a = SpectralDictionary(4, base=base, rank=4, ridge=0.0).fit(X, (U, Y))
    b = SpectralDictionary(4, base=base, rank=4, ridge=0.0).fit(X, Y)      # no controls
    assert a.n_features_ == b.n_features_ == 5 and not hasattr(base, "n_features_")
    assert not any(k.startswith("_dyn") for k in vars(a))


def test_random_fourier_on_one_sample_is_refused_at_fit():
    import warnings
    X = np.ones((1, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                  # no numpy "empty slice" warning first
        with pytest.raises(ValueError, match="^RandomFourierDictionary.fit: 1 sample has no pairwise distance"):
            RandomFourierDictionary(8).fit(X)
    assert RandomFourierDictionary(8, bandwidth=1.0).fit(X).transform(X).shape == (1, 9)   # a given σ is fine


def test_dictionary_docstrings_are_numpydoc():
    from coreinv.dictionaries import (Dictionary, IdentityDictionary, PCADictionary,
                                      RandomProjectionDictionary, SpectralDictionary)
    for cls in (PCADictionary, RandomProjectionDictionary, RandomFourierDictionary, SpectralDictionary,
                IdentityDictionary):
        assert "Parameters\n    ----------" in cls.__doc__, cls
    for f in (Dictionary.fit, Dictionary.transform):            # inspect.getdoc: whatever the indentation
        assert "Returns\n-------" in inspect.getdoc(f) and "Raises\n------" in inspect.getdoc(f)
