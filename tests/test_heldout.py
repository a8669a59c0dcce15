"""coreinv.heldout on planted cases: test windows that share a token with a train window are dropped (and
the twin without overlap keeps them all), the cap's hidden directions are counted, and a spectral
dictionary that drops its constant eigenfunction has the rank (and span) of any other full dictionary."""
import numpy as np
import pytest

from coreinv.dictionaries import IdentityDictionary, PCADictionary, RandomProjectionDictionary, SpectralDictionary
from coreinv.heldout import capped_directions, window_overlap, window_rows, window_split
from coreinv.invariance import span_residual, span_residual_features, split_rows
from coreinv.koopman import linear_control_system


def brute_shared(a, b, n_ctx):
    "Windows of a that share a token with a window of b, by listing tokens."
    toks = set().union(*(range(s, s + n_ctx) for s in b)) if len(b) else set()
    return np.array([bool(toks & set(range(s, s + n_ctx))) for s in a])


def test_window_split_drops_exactly_the_test_windows_that_share_tokens():
    rng = np.random.default_rng(0)
    starts = np.cumsum(rng.integers(3, 9, 120))                   # sentence starts, ~6 tokens apart
    train, test, dropped = window_split(starts, 24, block=8, seed=1)
    held = np.sort(np.r_[test, dropped])
    # the train side is the block split of the rows, unchanged by the dropping
    tr_ref, te_ref = split_rows(len(starts), 0.5, groups=np.arange(len(starts)) // 8, seed=1)
    assert np.array_equal(train, tr_ref) and np.array_equal(held, te_ref)
    shared = brute_shared(starts[held], starts[train], 24)
    assert np.array_equal(held[shared], np.sort(dropped)) and shared.any()
    assert not brute_shared(starts[test], starts[train], 24).any()
    assert np.array_equal(window_overlap(starts[held], starts[train], 24), shared)


def test_windows_that_do_not_overlap_are_all_kept():
    starts = np.arange(0, 24 * 64, 24)                            # the twin: windows 24 tokens apart
    train, test, dropped = window_split(starts, 24, block=8, seed=1)
    assert dropped.size == 0 and train.size + test.size == 64
    # one token more of context and every block edge shares a token
    _, _, dropped25 = window_split(starts, 25, block=8, seed=1)
    assert dropped25.size > 0


def test_window_split_refuses_bad_input():
    with pytest.raises(ValueError, match="strictly increasing"):
        window_split(np.array([0, 5, 5, 9]), 4)
    with pytest.raises(ValueError, match="every one of the"):
        window_split(np.arange(0, 40, 2), 48, block=1)           # every test window overlaps
    with pytest.raises(ValueError, match="block"):
        window_split(np.arange(10), 2, block=0)
    with pytest.raises(ValueError, match="n_ctx"):
        window_overlap(np.arange(3), np.arange(3), 0)


def test_window_rows_lays_out_window_major_rows():
    assert window_rows([0, 2], 3).tolist() == [0, 1, 2, 6, 7, 8]


def test_capped_directions_counts_the_planted_ill_conditioned_ones_and_not_the_twins():
    rng = np.random.default_rng(0)
    n = 400
    FX, U = rng.standard_normal((n, 5)), rng.standard_normal((n, 35))
    FY = np.c_[FX[:, :3] @ rng.standard_normal((3, 3)), rng.standard_normal((n, 2))]
    twin = FX @ rng.standard_normal((5, 5))
    tr, te = np.arange(80), np.arange(80, n)                      # 80 train rows, 40 regressors: overfit
    r, t = span_residual_features(FX, FY, U, tr, te), span_residual_features(FX, twin, U, tr, te)
    assert capped_directions(r) == 2 and capped_directions(t) == 0
    assert r.worst > 1 and abs(r.mean - 2 / 5) < 1e-6             # the mean shows them only as 1 each
    assert capped_directions(r.values, cap=r.worst) == 0


def test_spectral_without_its_constant_eigenfunction_has_the_full_rank_and_span():
    A, B, X, U, Y = linear_control_system(2000, noise=0.1)
    tr, te = split_rows(2000, 0.5, seed=2)
    D = X.shape[1]
    full = [span_residual(d, X, U, Y, tr, te) for d in (RandomProjectionDictionary(D, seed=3), PCADictionary(D))]
    dropped = span_residual(SpectralDictionary(D, base=IdentityDictionary(), drop_constant=True), X, U, Y, tr, te)
    kept = span_residual(SpectralDictionary(D, base=IdentityDictionary()), X, U, Y, tr, te)
    assert all(r.values.size == D for r in full) and dropped.values.size == D
    assert abs(dropped.mean - full[0].mean) < 1e-8 and abs(full[1].mean - full[0].mean) < 1e-8
    assert kept.values.size == D - 1                              # the twin: its constant is one of the D
    sd = SpectralDictionary(D, base=IdentityDictionary(), drop_constant=True).fit(X, (U, Y))
    assert np.all(np.abs(sd.eigvals_ - 1) > 1e-6)
