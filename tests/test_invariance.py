"""coreinv.invariance on planted systems: the span residual is basis-free and out of sample (the old
variance-weighted residual is not basis-free), a closed nonlinear dictionary scores ~0 and a truncated
one > 0, the sparse nonlinear null matches firing frequencies, and the rate's interval is calibrated."""
import numpy as np
import pytest

from coreinv.dictionaries import Dictionary, IdentityDictionary, PCADictionary, RandomProjectionDictionary
from coreinv.invariance import (SparseReLUDictionary, gap_cut, rate_fit, slow_manifold_system, span_residual,
                                span_residual_features, split_rows)
from coreinv.koopman import linear_control_system
from coreinv.spectra import invariance_residual, spectral_distance

lift = lambda Z: np.c_[Z, Z[:, 0] ** 2]                          # (x1, x2, x1^2): closed under the map


class Fixed(Dictionary):
    "lift(x) @ T: for T invertible, the same span in another basis."
    fit_reads_data = False

    def __init__(self, T=None, constant=True): self.T, self.constant = T, constant
    def _fit(self, X, y=None): pass
    def _n_features(self): return 3
    def _features(self, Z): return lift(Z) @ (np.eye(3) if self.T is None else self.T)


T = np.random.default_rng(1).standard_normal((3, 3))


def test_same_span_other_basis_scores_the_same_and_the_old_residual_does_not():
    X, U, Y = slow_manifold_system(4000, noise=0.3, seed=0)
    tr, te = split_rows(4000, 0.5, seed=0)
    new = [span_residual(Fixed(t), X, U, Y, tr, te) for t in (None, T, 7.0 * T)]
    old = [invariance_residual(Fixed(t), X, U, Y).overall for t in (None, T)]
    assert new[0].mean > 0.01                                      # a noisy system: not trivially 0
    for r in new[1:]:
        assert abs(r.mean - new[0].mean) < 1e-8 and abs(r.worst - new[0].worst) < 1e-8
    assert abs(old[0] - old[1]) > 1e-3                             # the old ruler fails this test


def test_linear_bases_of_one_space_agree():
    A, B, X, U, Y = linear_control_system(2000, noise=0.1)
    tr, te = split_rows(2000, 0.5, seed=2)
    vals = [span_residual(d, X, U, Y, tr, te).mean
            for d in (IdentityDictionary(), PCADictionary(4), RandomProjectionDictionary(4, seed=3))]
    assert np.ptp(vals) < 1e-8


def test_closed_nonlinear_dictionary_is_zero_and_truncated_is_not_out_of_sample():
    X, U, Y = slow_manifold_system(4000, seed=0)
    tr, te = split_rows(4000, 0.5, seed=0)
    closed = span_residual(Fixed(), X, U, Y, tr, te)
    truncated = span_residual(IdentityDictionary(), X, U, Y, tr, te)
    assert closed.worst < 1e-10 and truncated.mean > 0.1 and truncated.n_test == len(te)
    # in sample the values are 1 - rho^2 of the canonical correlations
    Xn, Un, Yn = slow_manifold_system(1000, noise=0.2, seed=3)
    r = span_residual_features(lift(Xn), lift(Yn), Un)
    G, Z = np.c_[lift(Xn), Un], lift(Yn)
    G, Z = G - G.mean(0), Z - Z.mean(0)
    qg, qz = np.linalg.qr(G)[0], np.linalg.qr(Z)[0]
    rho = np.linalg.svd(qg.T @ qz, compute_uv=False)
    assert np.allclose(np.sort(r.values), np.sort(1 - rho ** 2), atol=1e-9)


def test_sparse_relu_null_matches_frequencies_and_refuses_bad_ones():
    X = np.random.default_rng(0).standard_normal((3000, 8))
    f = np.array([0.02, 0.1, 0.5, 1.0])
    d = SparseReLUDictionary(f, seed=0).fit(X)
    assert np.allclose((d.transform(X)[:, 1:] > 0).mean(0), f, atol=2e-3)
    with pytest.raises(ValueError, match="frequencies"):
        SparseReLUDictionary([0.0, 0.3]).fit(X)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one shape"):
        span_residual_features(np.zeros((10, 3)), np.zeros((10, 2)))
    with pytest.raises(ValueError, match="constant"):
        span_residual_features(np.ones((10, 3)), np.ones((10, 3)))
    with pytest.raises(ValueError, match="test set"):
        F = np.random.default_rng(0).standard_normal((40, 5))
        span_residual_features(F, F, None, np.arange(35), np.arange(35, 40))
    with pytest.raises(ValueError, match="test_size"):
        split_rows(10, 1.5)


def test_gap_cut_never_splits_a_cluster_or_a_conjugate_pair():
    assert gap_cut(np.array([0.9 + 0.1j, 0.9 - 0.1j, 0.5]), 0.01) == 2
    assert gap_cut(np.array([1.17, 1.17, 1.132, 1.13, 0.5]), 0.05, k_max=3) is None   # the cluster
    assert gap_cut(np.array([1.0, 0.6, 0.59, 0.2]), 0.02, factor=3) == 3


class LS:
    "Least-squares [A B]; eigvals_ of A."
    def fit(self, X, U, Y):
        W = np.linalg.lstsq(np.c_[X, U], Y, rcond=None)[0]
        self.eigvals_ = np.linalg.eigvals(W[:X.shape[1]].T)
        return self


def test_rate_interval_covers_minus_half_in_at_least_90_percent_of_50_runs():
    cover, slopes = [], []
    for s in range(50):
        A, B, X, U, Y = linear_control_system(4000, noise=0.5, seed=100 + s)
        r = rate_fit(X, U, Y, [500, 1000, 2000, 4000], LS, k=4, n_splits=8, seed=s)
        cover.append(r.ci[0] <= -0.5 <= r.ci[1]); slopes.append(r.slope)
    assert np.mean(cover) >= 0.9, (np.mean(cover), np.mean(slopes))
    assert abs(np.mean(slopes) + 0.5) < 0.05                       # and the estimate is centred


def test_rate_fit_refuses_bad_sizes():
    A, B, X, U, Y = linear_control_system(100)
    with pytest.raises(ValueError, match="largest M"):
        rate_fit(X, U, Y, [50, 200], LS)
    with pytest.raises(ValueError, match="at least 2"):
        rate_fit(X, U, Y, [50], LS)


def test_basis_change_keeps_spectrum_and_span_residual_and_ls_matches_edmdc():
    from coreinv.invariance import BasisChange, LeastSquaresRealisation
    from coreinv.koopman import EDMDc
    from coreinv.spectra import spectral_distance
    A, B, X, U, Y = linear_control_system(3000, noise=0.2, seed=4)
    base = PCADictionary(4).fit(X)
    bc = BasisChange(base, seed=1, spread=1.5).fit(X)
    assert np.linalg.cond(bc.T_) <= np.exp(3.0) + 1e-9
    e1 = EDMDc(base, fit_dictionary=False, progress=False).fit(X, U, Y)
    e2 = EDMDc(bc, fit_dictionary=False, progress=False).fit(X, U, Y)
    assert spectral_distance(e1, e2) < 1e-8
    ls = LeastSquaresRealisation().fit(X, U, Y)
    assert spectral_distance(e1.eigvals_[1:], ls.eigvals_) < 1e-6
    with pytest.raises(ValueError, match="fitted base"):
        BasisChange(PCADictionary(4)).fit(X)


def test_a_feature_constant_on_the_test_rows_is_left_out_not_an_error():
    rng = np.random.default_rng(0)
    F = rng.standard_normal((400, 4))
    F[:, 3] = np.where(np.arange(400) < 200, rng.standard_normal(400), 0.0)   # fires only in train
    G = F + 0.1 * rng.standard_normal((400, 4))
    G[200:, 3] = 0.0
    r = span_residual_features(F, G, None, np.arange(200), np.arange(200, 400))
    assert r.values.size == 3 and np.isfinite(r.mean)


def test_cv_readout_is_honest_and_edits_are_matched_and_spare_bos():
    from coreinv.invariance import cv_ridge_readout, leading_mode_indices, removed_rms, restricted_edit
    from coreinv.koopman import EDMDc
    rng = np.random.default_rng(0)
    H = rng.standard_normal((120, 40))
    y = H[:, 0] + 0.5 * rng.standard_normal(120)                   # truth R2 = 0.8
    read, alpha, r2 = cv_ridge_readout(H, y)
    assert 0.6 < r2 < 0.9 and read(H).shape == (120,)
    A, B, X, U, Y = linear_control_system(2000, noise=0.1)
    m = EDMDc(PCADictionary(4, constant=False), progress=False).fit(X, U, Y)
    assert leading_mode_indices(m, 1) == ([], 0)                   # the leading pair is not split
    assert leading_mode_indices(m, 2)[1] == 2 and leading_mode_indices(m, 4)[1] == 4
    Z = rng.standard_normal((30, 4))
    e = restricted_edit(lambda H: H * 0, 5, scale=0.5)
    assert np.array_equal(e(Z)[::5], Z[::5])
    assert np.isclose(removed_rms(e, Z), 0.5 * removed_rms(restricted_edit(lambda H: H * 0, 5), Z))
    with pytest.raises(ValueError, match="varying"):
        cv_ridge_readout(H, np.ones(120))


def test_train_and_test_must_come_together_and_not_overlap():
    X, U, Y = slow_manifold_system(400, noise=0.3, seed=0)
    tr, te = split_rows(400, 0.5, seed=0)
    with pytest.raises(ValueError, match="both train and test"):
        span_residual(Fixed(), X, U, Y, train=tr)
    with pytest.raises(ValueError, match="both train and test"):
        span_residual(Fixed(), X, U, Y, test=te)
    with pytest.raises(ValueError, match="overlap"):
        span_residual(Fixed(), X, U, Y, train=tr, test=np.r_[te, tr[:3]])
    F = np.random.default_rng(0).standard_normal((40, 3))
    with pytest.raises(ValueError, match="without train"):
        span_residual_features(F, F, None, test=np.arange(20))
    with pytest.raises(ValueError, match="overlap"):
        span_residual_features(F, F, None, np.arange(25), np.arange(20, 40))
    span_residual(Fixed(), X, U, Y, train=tr, test=te)                    # disjoint: accepted


def test_gap_cut_at_zero_error_never_splits_a_conjugate_pair():
    ev = np.array([0.9, 0.5 + 0.1j, 0.5 - 0.1j])
    assert gap_cut(ev, 0.0, k_max=2) == 1                           # ">=" would cut inside the pair (k = 2)
    assert gap_cut(np.array([0.9 + 0.1j, 0.9 - 0.1j]), 0.0) is None


def test_restricted_edit_refuses_a_scale_above_one():
    from coreinv.invariance import restricted_edit
    with pytest.raises(ValueError, match="reflection"):
        restricted_edit(lambda H: H * 0, 5, scale=2.9)
    with pytest.raises(ValueError, match="reflection"):
        restricted_edit(lambda H: H * 0, 5, scale=-0.1)


def _planted_intervention(readout_on_slow: bool, d: int = 3, seed: int = 0):
    """x' = A x + B u with two slow modes (0.95, 0.9) and six fast ones (≤ 0.2); the readout d steps on is
    c·A^d x. Rank-matched removals (k = 2, never scaled): the leading Koopman modes vs random 2-dim subspaces."""
    from coreinv.invariance import leading_mode_indices, removed_rms, restricted_edit
    from coreinv.koopman import EDMDc
    from coreinv.spectra import project_out
    rng = np.random.default_rng(seed)
    D = 8
    V = rng.standard_normal((D, D))
    lam = np.array([0.95, 0.9, 0.2, 0.15, 0.1, 0.08, 0.05, 0.03])
    A = V @ np.diag(lam) @ np.linalg.inv(V)
    B = 0.1 * rng.standard_normal((D, 2))
    X, U = rng.standard_normal((4000, D)), rng.standard_normal((4000, 2))
    Y = X @ A.T + U @ B.T + 0.01 * rng.standard_normal((4000, D))
    c = rng.standard_normal(D)
    if not readout_on_slow:                                         # the twin: c ⟂ the slow right eigenvectors
        Q = np.linalg.qr(V[:, :2])[0]
        c = c - Q @ (Q.T @ c)
    read = lambda H: H @ np.linalg.matrix_power(A, d).T @ c
    m = EDMDc(PCADictionary(D, constant=False), progress=False).fit(X, U, Y)
    idx, k = leading_mode_indices(m, 2)
    assert k == 2
    effect = lambda e: float(np.sqrt(np.mean((read(e(X)) - read(X)) ** 2)) / read(X).std())
    modes = lambda H: m.intervene(H, idx)
    rand = [project_out(np.random.default_rng(100 + s).standard_normal((D, k))) for s in range(20)]
    for e in rand + [modes]:
        assert removed_rms(restricted_edit(e, 2, skip=()), X) > 0
    return effect(modes), float(np.mean([effect(e) for e in rand]))


def test_planted_intervention_removing_true_modes_beats_random_and_the_twin_reverses():
    mod, rnd = _planted_intervention(readout_on_slow=True)
    assert mod > 1.5 * rnd, (mod, rnd)                               # the slow modes carry the readout
    mod, rnd = _planted_intervention(readout_on_slow=False)
    assert mod < 0.5 * rnd, (mod, rnd)                               # twin: the readout ignores them


def _planted_realisation(moduli, n, noise, seed):
    "x' = A x + B u + noise with A = Q diag(moduli) Qᵀ (a rotation block for the first pair), Q orthogonal."
    rng = np.random.default_rng(seed)
    D = len(moduli)
    A = np.diag(np.asarray(moduli, float))
    c, s = np.cos(0.3), np.sin(0.3)
    A[:2, :2] = moduli[0] * np.array([[c, -s], [s, c]])               # a conjugate pair at the top
    Q = np.linalg.qr(np.random.default_rng(1000).standard_normal((D, D)))[0]
    A, B = Q @ A @ Q.T, np.random.default_rng(1001).standard_normal((D, 2))
    X, U = rng.standard_normal((n, D)), rng.standard_normal((n, 2))
    return X, U, X @ A.T + U @ B.T + noise * rng.standard_normal((n, D))


def test_gap_rule_then_rate_end_to_end_on_a_planted_spectrum_and_a_twin_without_a_gap():
    """The chapter's recipe on a realisation whose spectrum is known: the error is the split-half distance of
    the top k_max eigenvalues on the full data, the cut is `gap_cut`, the slope is `rate_fit` at that cut.
    Planted: four slow modes (a pair at 0.9, then 0.5 and 0.45) above four fast ones (≤ 0.1): the cut must
    land at k = 4 and the interval cover −1/2 (30 seeded runs). Twin: moduli 0.02 apart, no gap of 3 × the
    error: no cut (not testable)."""
    slow = [0.9, 0.9, 0.5, 0.45, 0.1, 0.08, 0.05, 0.02]
    even = [0.9, 0.9, 0.88, 0.86, 0.84, 0.82, 0.8, 0.78]             # gaps of 0.02, below 3 × the error
    cuts, cover, twin_cuts = [], [], []
    for s in range(30):
        X, U, Y = _planted_realisation(slow, 4000, 0.5, seed=s)
        h = 2000
        err = spectral_distance(LS().fit(X[:h], U[:h], Y[:h]), LS().fit(X[h:], U[h:], Y[h:]), 6)
        k = gap_cut(LS().fit(X, U, Y).eigvals_, err, factor=3.0, k_max=6)
        cuts.append(k)
        if k:
            r = rate_fit(X, U, Y, [500, 1000, 2000, 4000], LS, k=k, n_splits=8, seed=s)
            cover.append(r.ci[0] <= -0.5 <= r.ci[1])
        if s < 10:
            X, U, Y = _planted_realisation(even, 4000, 0.5, seed=s)
            err = spectral_distance(LS().fit(X[:h], U[:h], Y[:h]), LS().fit(X[h:], U[h:], Y[h:]), 6)
            twin_cuts.append(gap_cut(LS().fit(X, U, Y).eigvals_, err, factor=3.0, k_max=6))
    assert np.mean([k == 4 for k in cuts]) >= 0.9, cuts
    assert len(cover) >= 27 and np.mean(cover) >= 0.9, np.mean(cover)
    assert sum(k is None for k in twin_cuts) >= 9, twin_cuts         # no gap of that size: no rate
