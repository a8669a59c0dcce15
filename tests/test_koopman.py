"""EDMDc and the spectral tools of coreinv.koopman (paper B): known answers and invariances."""
import numpy as np
import pytest
import scipy.linalg as sla

from coreinv.dictionaries import IdentityDictionary, RandomFourierDictionary
from coreinv.identify import match_spectra
from coreinv.koopman import (EDMDc, eigvec_condition, henrici, invariance_residual, linear_control_system,
                             mode_pca_angles, spectral_distance, split_half_curve)


def random_system(D=6, Du=3, seed=0, n=400):
    "A random stable system with several complex pairs; noise-free iid samples."
    rng = np.random.default_rng(seed)
    blocks = []
    for k in range(D // 2):
        r, th = rng.uniform(0.3, 0.95), rng.uniform(0.2, 2.5)
        blocks.append(r * np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]]))
    S = rng.standard_normal((D, D))
    A = S @ sla.block_diag(*blocks) @ np.linalg.inv(S)
    B = rng.standard_normal((D, Du))
    X, U = rng.standard_normal((n, D)), rng.standard_normal((n, Du))
    return A, B, X, U, X @ A.T + U @ B.T


def test_identity_recovers_A_B_with_complex_pairs():
    A, B, X, U, Y = random_system()
    assert np.iscomplex(np.linalg.eigvals(A)).sum() == 6
    m = EDMDc().fit(X, U, Y)
    assert np.abs(m.A_ - A).max() < 1e-8 and np.abs(m.B_ - B).max() < 1e-8
    assert match_spectra(m.eigvals_, np.linalg.eigvals(A))[0] < 1e-8
    # the IdentityDictionary (affine DMDc, with a constant) recovers them too, plus eigenvalue 1
    md = EDMDc(IdentityDictionary()).fit(X, U, Y)
    assert np.abs(md.A_[1:, 1:] - A).max() < 1e-8 and np.abs(md.B_[1:] - B).max() < 1e-8
    assert np.abs(md.eigvals_ - 1).min() < 1e-8 and np.allclose(md.C_, np.c_[np.zeros(6), np.eye(6)], atol=1e-8)


def test_agrees_with_pydmd_dmdc():
    from pydmd import DMDc
    A, B, _, _, _ = random_system(seed=1)
    rng = np.random.default_rng(2)
    T = np.zeros((401, 6)); Uc = rng.standard_normal((400, 3)); T[0] = rng.standard_normal(6)
    for t in range(400): T[t + 1] = A @ T[t] + B @ Uc[t]
    ref = DMDc(svd_rank=-1, svd_rank_omega=-1).fit(T.T, Uc.T)          # PyDMD: columns are snapshots
    ours = EDMDc().fit(T[:-1], Uc, T[1:])                              # ours: rows are samples
    assert match_spectra(ours.eigvals_, ref.eigs)[0] < 1e-8
    assert match_spectra(ours.eigvals_, np.linalg.eigvals(A))[0] < 1e-8
    assert np.allclose(ref.B, ours.B_, atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_spectrum_invariant_under_change_of_basis(seed):
    A, B, X, U, Y = linear_control_system(1500, noise=0.1, seed=seed)
    Y = Y + 0.2 * np.sin(X)                                            # nonlinear: nothing exact
    base = RandomFourierDictionary(20, seed=seed).fit(X)
    T = np.random.default_rng(seed + 10).standard_normal((21, 21))

    class Transformed:
        def fit(self, X): return self
        def transform(self, X): return base.transform(X) @ T.T

    e1 = EDMDc(base, fit_dictionary=False).fit(X, U, Y).eigvals_
    e2 = EDMDc(Transformed()).fit(X, U, Y).eigvals_
    assert match_spectra(e1, e2)[0] < 1e-7 * max(1, np.linalg.cond(T) / 1e3)
    assert not np.allclose(EDMDc(Transformed()).fit(X, U, Y).A_, EDMDc(base, fit_dictionary=False).fit(X, U, Y).A_)


def test_split_half_slope_is_minus_half():
    A, B, X, U, Y = linear_control_system(16000, noise=0.5, seed=11)
    c = split_half_curve(X, U, Y, Ms=[250, 500, 1000, 2000, 4000, 8000, 16000], n_splits=20, seed=3)
    assert -0.6 < c.slope < -0.4, c
    assert c.ci[0] < c.slope < c.ci[1]
    d = c.distances.mean(1)
    assert 4 < d[0] / d[-1] < 16                                       # 64× the data: ≈ 8× closer


def test_median_of_means_beats_plain_on_student_t():
    def err(m, A, B): return np.sqrt(np.sum((m.A_ - A) ** 2) + np.sum((m.B_ - B) ** 2))
    plain, mom = [], []
    for rep in range(300):
        A, B, X, U, Y = linear_control_system(2000, noise=0.1, seed=5000 + rep, noise_dist="t", df=2.5)
        plain.append(err(EDMDc().fit(X, U, Y), A, B))
        mom.append(err(EDMDc(mom_blocks=10).fit(X, U, Y), A, B))
    plain, mom = np.array(plain), np.array(mom)
    assert mom.mean() < plain.mean()
    d = plain - mom                                                    # paired: same data for both
    # not a coin flip: the paired t statistic was 1.9-3.4 with 200 repeats on four seed sets
    assert d.mean() / (d.std(ddof=1) / np.sqrt(len(d))) > 1.5
    # and on Gaussian noise it costs little (no free lunch claimed, but no disaster either)
    A, B, X, U, Y = linear_control_system(2000, noise=0.1, seed=1)
    assert err(EDMDc(mom_blocks=10).fit(X, U, Y), A, B) < 2 * err(EDMDc().fit(X, U, Y), A, B) + 1e-3


def test_qr_beats_normal_equations_when_ill_conditioned():
    class Monomials:
        def fit(self, X): return self
        def transform(self, X): return X[:, :1] ** np.arange(11)
    x = np.random.default_rng(0).uniform(0, 1, (3000, 1))
    u = np.random.default_rng(1).standard_normal((3000, 1))
    true = 0.7 ** np.arange(11)
    e_qr = match_spectra(EDMDc(Monomials()).fit(x, u, 0.7 * x).eigvals_, true)[0]
    e_ne = match_spectra(EDMDc(Monomials(), solver="normal").fit(x, u, 0.7 * x).eigvals_, true)[0]
    assert np.linalg.cond(Monomials().transform(x)) > 1e6
    assert e_qr < 1e-6 and e_ne > 1e3 * e_qr
    # on a well-conditioned problem both solvers agree
    A, B, X, U, Y = linear_control_system(500, noise=0.1)
    assert np.allclose(EDMDc(solver="normal").fit(X, U, Y).A_, EDMDc().fit(X, U, Y).A_, atol=1e-10)


def test_partial_fit_equals_fit_and_memory_is_constant():
    A, B, X, U, Y = linear_control_system(5000, noise=0.2, seed=3)
    d = RandomFourierDictionary(16).fit(X)
    s = EDMDc(d, fit_dictionary=False)
    shapes = set()
    for i in range(0, 5000, 500):
        s.partial_fit(X[i:i + 500], U[i:i + 500], Y[i:i + 500]); shapes.add(s.stats_[0].shape)
    f = EDMDc(d, fit_dictionary=False).fit(X, U, Y)
    assert shapes == {(17 + 2 + 17 + 4,) * 2}
    assert s.n_samples_seen_ == 5000
    assert np.allclose(s.A_, f.A_, atol=1e-10) and np.allclose(s.C_, f.C_, atol=1e-10)
    # a batch smaller than the number of columns is fine (R is padded)
    t = EDMDc()
    for i in range(0, 60, 3): t.partial_fit(X[i:i + 3], U[i:i + 3], Y[i:i + 3])
    assert np.allclose(t.A_, EDMDc().fit(X[:60], U[:60], Y[:60]).A_, atol=1e-10)


def test_rank_and_ridge():
    A, B, X, U, Y = linear_control_system(800, noise=0.05, seed=4)
    full = EDMDc(IdentityDictionary(constant=False)).fit(X, U, Y)
    r4 = EDMDc(IdentityDictionary(constant=False), rank=4).fit(X, U, Y)
    assert match_spectra(full.eigvals_, r4.eigvals_)[0] < 1e-10        # full rank: same spectrum
    r2 = EDMDc(rank=2).fit(X, U, Y)
    assert r2.A_.shape == (2, 2) and r2.C_.shape == (4, 2) and r2.basis_.shape == (4, 2)
    assert np.allclose(r2.A_, EDMDc(rank=2, solver="normal").fit(X, U, Y).A_, atol=1e-8)
    lam = 50.0
    rid = EDMDc(ridge=lam).fit(X, U, Y)
    Z = np.hstack([X, U])
    K = np.linalg.solve(Z.T @ Z + lam * np.eye(6), Z.T @ Y)
    assert np.allclose(rid.A_, K[:4].T, atol=1e-10) and np.allclose(rid.B_, K[4:].T, atol=1e-10)


def test_invariance_residual():
    A, B, X, U, Y = linear_control_system(2000, seed=7)
    lam, W = sla.eig(A, left=True, right=False)

    class Eigenfunctions:
        def fit(self, X): return self
        def transform(self, X):
            F = X @ W.conj()
            return np.hstack([F.real, F.imag[:, lam.imag > 1e-12]])
    assert invariance_residual(Eigenfunctions(), X, U, Y).overall < 1e-20
    r = invariance_residual(RandomFourierDictionary(32), X, U, Y)
    assert r.overall > 1e-2 and r.per_feature.shape == (33,) and r.constant[0] and not r.constant[1:].any()
    assert np.all(r.per_feature >= 0)


def test_projectors_and_intervention():
    A, B, X, U, Y = random_system(seed=5)
    m = EDMDc().fit(X, U, Y)
    P = m.spectral_projectors()
    assert np.allclose(P.sum(0), np.eye(6), atol=1e-9)
    assert np.allclose(np.einsum("i,iab->ab", m.eigvals_, P), m.A_, atol=1e-9)
    for i in range(6):
        for j in range(6):
            assert np.allclose(P[i] @ P[j], P[i] if i == j else 0, atol=1e-8)
    Xs = m.intervene(X, [0], scale=0.5)
    W = m.left_eigvecs_
    assert np.allclose(Xs @ W[:, :2].conj(), 0.5 * X @ W[:, :2].conj(), atol=1e-9)
    assert np.allclose(Xs @ W[:, 2:].conj(), X @ W[:, 2:].conj(), atol=1e-9)
    assert np.isrealobj(Xs)


def test_nonnormality_measures():
    assert henrici(np.diag([0.5, -0.2, 0.9])) < 1e-12
    assert abs(eigvec_condition(np.diag([0.5, -0.2, 0.9])) - 1) < 1e-12
    J = np.array([[0.5, 3.0], [0.0, 0.2]])
    assert abs(henrici(J) - 3.0 / np.sqrt(0.25 + 9 + 0.04)) < 1e-12
    assert eigvec_condition(J) > 10


def test_modes_vs_pca_on_diagonal_system():
    rng = np.random.default_rng(0)
    A = np.diag([0.95, 0.6, 0.1])
    x = np.zeros((20001, 3)); E = rng.standard_normal((20000, 3))
    for t in range(20000): x[t + 1] = A @ x[t] + E[t]
    m = EDMDc().fit(x[:-1], None, x[1:])
    assert mode_pca_angles(m, x[:-1], 2).max() < 0.05


def test_spectral_distance():
    assert spectral_distance([1, 2j, -2j], [-2j, 2j, 1.5]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="pass k"):
        spectral_distance([1, 2], [1, 2, 3])


def test_bad_input_raises_clear_value_errors():
    A, B, X, U, Y = linear_control_system(100)
    with pytest.raises(ValueError, match="same number of samples"):
        EDMDc().fit(X, U[:-1], Y)
    with pytest.raises(ValueError, match="same number of samples"):
        EDMDc().fit(X, U, Y[:50])
    Xn = X.copy(); Xn[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        EDMDc().fit(Xn, U, Y)
    with pytest.raises(ValueError, match="NaN"):
        EDMDc().fit(X, U, np.where(Y > 1, np.inf, Y))
    with pytest.raises(ValueError, match="rank 6 is larger than the dictionary's dimension 5"):
        EDMDc(IdentityDictionary(), rank=6).fit(X, U, Y)
    with pytest.raises(ValueError, match="rank 5 is larger"):
        EDMDc(rank=5).fit(X, U, Y)
    for call in (lambda m: m.predict(X, U), lambda m: m.lift(X), lambda m: m.spectral_projectors(),
                 lambda m: m.intervene(X, [0])):
        with pytest.raises(ValueError, match="call fit first"):
            call(EDMDc())
    with pytest.raises(ValueError, match="solver"):
        EDMDc(solver="svd").fit(X, U, Y)
    with pytest.raises(ValueError, match="2-D"):
        EDMDc().fit(X[None], U, Y)
