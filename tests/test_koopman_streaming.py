"EDMDc.partial_fit equals one fit on all the data, with each dictionary (issue 23 item 4)."
import numpy as np
import pytest
import torch

from coreinv.base import clone
from coreinv.dictionaries import (IdentityDictionary, PCADictionary, RandomFourierDictionary,
                                  RandomProjectionDictionary, SAEDictionary, SpectralDictionary)
from coreinv.koopman import EDMDc, linear_control_system


class _Encoder(torch.nn.Module):
    "A fixed random ReLU encoder standing in for an SAE."
    def __init__(self, d=4, k=12):
        super().__init__()
        self.W = torch.randn(d, k, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    def encode(self, x): return torch.relu(x.double() @ self.W)


class _Squares:
    "A user's own dictionary: no fit_reads_data attribute."
    def fit(self, X): return self
    def transform(self, X): return np.hstack([np.ones((len(X), 1)), X, X ** 2])


DICTIONARIES = {
    "identity": IdentityDictionary(), "pca": PCADictionary(3), "random projection": RandomProjectionDictionary(3),
    "rff, median bandwidth": RandomFourierDictionary(24), "rff, given bandwidth": RandomFourierDictionary(24, bandwidth=2.0),
    "spectral": SpectralDictionary(2, base=IdentityDictionary(constant=False), rank=4),
    "sae": SAEDictionary(_Encoder(), n_components=6), "your own": _Squares()}


def _data():
    A, B, X, U, Y = linear_control_system(2000, noise=0.1, seed=7)
    X = X + np.array([3.0, 0, 0, 0])            # a mean, so that a first-batch PCA centre differs
    Y = Y + np.array([3.0, 0, 0, 0])
    return X, U, Y


def _stream(model, X, U, Y, batch=200):
    for s in range(0, len(X), batch): model.partial_fit(X[s:s + batch], U[s:s + batch], Y[s:s + batch])
    return model


@pytest.mark.parametrize("name", list(DICTIONARIES))
def test_streaming_equals_one_fit_with_each_dictionary(name):
    "PCADictionary was fitted on the first batch only (max |ΔA| 4.4 against one fit)."
    X, U, Y = _data()
    d = DICTIONARIES[name]
    one = EDMDc(clone(d) if hasattr(d, "get_params") else d).fit(X, U, Y)     # fits the dictionary on all X
    if getattr(d, "fit_reads_data", True):
        with pytest.raises(ValueError, match=r"first batch alone.*fit_dictionary=False"):
            EDMDc(d).partial_fit(X[:200], U[:200], Y[:200])
        fitted = one.dictionary_                                            # what one fit fitted, on all X
        stream = _stream(EDMDc(fitted, fit_dictionary=False), X, U, Y)
    else:
        stream = _stream(EDMDc(d), X, U, Y)
    assert stream.n_samples_seen_ == len(X)
    assert np.allclose(stream.A_, one.A_, atol=1e-8), np.abs(stream.A_ - one.A_).max()
    assert np.allclose(stream.B_, one.B_, atol=1e-8) and np.allclose(stream.C_, one.C_, atol=1e-8)


def test_which_dictionaries_read_the_data():
    assert not IdentityDictionary().fit_reads_data and not RandomProjectionDictionary(2).fit_reads_data
    assert RandomFourierDictionary(8).fit_reads_data and not RandomFourierDictionary(8, bandwidth=1.0).fit_reads_data
    assert PCADictionary(2).fit_reads_data and SpectralDictionary(2).fit_reads_data
    assert not clone(RandomFourierDictionary(8, bandwidth=1.0)).fit_reads_data
