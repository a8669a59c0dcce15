"identify: operator fitting and spectral matching."
from itertools import permutations

import numpy as np
import pytest
import torch

from coreinv.identify import fit_operator, lagged_pairs, match_spectra, operator_spectrum


def test_fit_operator_recovers_known_operator():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(4, 4, generator=g, dtype=torch.float64)
    Z = torch.randn(100, 4, generator=g, dtype=torch.float64)
    assert torch.allclose(fit_operator(Z, Z @ A.T), A, atol=1e-10)
    assert torch.allclose(fit_operator(Z.float(), (Z @ A.T).float()), A, atol=1e-4)


def test_fit_operator_ridge_and_errors():
    Z = torch.randn(50, 3, dtype=torch.float64)
    A = fit_operator(Z, Z, ridge=1.0)
    assert torch.allclose(A.T, torch.linalg.solve(Z.T @ Z + torch.eye(3, dtype=torch.float64), Z.T @ Z))
    for bad in [(Z, Z[:-1]), (Z[:, 0], Z), (Z[:2], Z[:2])]:
        with pytest.raises(ValueError):
            fit_operator(*bad)
    with pytest.raises(ValueError):
        fit_operator(Z, Z, ridge=-1)
    Zn = Z.clone(); Zn[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        fit_operator(Zn, Z)


def test_lagged_pairs_stays_within_sequences():
    Z = torch.arange(2 * 4 * 1, dtype=torch.float64).reshape(2, 4, 1)
    X0, X1 = lagged_pairs(Z)
    assert X0.ravel().tolist() == [0, 1, 2, 4, 5, 6] and X1.ravel().tolist() == [1, 2, 3, 5, 6, 7]


def test_match_spectra_hand_cases():
    assert match_spectra([0, 2], [1, 3.5])[0] == 1.5
    assert match_spectra([0, 3], [3, 5])[0] == 3.0
    d, p = match_spectra([3 - 2j, -2 - 3j, 2j], [-3, -2 - 3j, 3j])
    assert np.isclose(d, np.sqrt(26))
    lam = 0.9 * np.exp(0.3j)
    d, p = match_spectra([lam, np.conj(lam)], [np.conj(lam) + 0.01, lam - 0.02j])
    assert np.isclose(d, 0.02) and p.tolist() == [[0, 1], [1, 0]]


def test_match_spectra_symmetric_zero_and_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(30):
        n = int(rng.integers(1, 6))
        x = rng.normal(size=n) + 1j * rng.normal(size=n)
        y = rng.normal(size=n) + 1j * rng.normal(size=n)
        d = match_spectra(x, y)[0]
        assert d == match_spectra(y, x)[0]
        assert match_spectra(x, x[::-1])[0] == 0.0
        brute = min(max(abs(x[i] - y[j]) for i, j in enumerate(s)) for s in permutations(range(n)))
        assert np.isclose(d, brute)


def test_match_spectra_sizes_must_agree():
    with pytest.raises(ValueError, match="same size"):
        match_spectra([1, 2], [1])


def test_operator_spectrum_sorted():
    A = torch.diag(torch.tensor([0.1, -0.9, 0.5], dtype=torch.float64))
    assert np.allclose(operator_spectrum(A), [-0.9, 0.5, 0.1])
    with pytest.raises(ValueError):
        operator_spectrum(torch.zeros(2, 3))
