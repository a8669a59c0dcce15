"""Tests for coreinv.tasks.markov beyond the notebook's own checks (nbs/21_tasks_markov.ipynb, run by nbval):
chains of other sizes and spectra, closed-form entropy rates, seeded training on two CPU threads (in two
processes: tests/test_determinism.py), and a dry run of the chapter's steps at the `paper` preset's sizes."""

import numpy as np
import pytest
import torch

from coreinv.hooks import record_activation
from coreinv.compare import cca, projector_overlap, weight_cosine
from coreinv.merge import core_aligned_rotation, interpolate, rotate_residual
from coreinv.tasks.markov import SIZES
from coreinv.tasks.markov import (CHAINS, HOOK, entropy_rate, markov_chain, markov_core_report, markov_metrics,
                                  nontrivial_eigenvalues, rank_k_kl, sample_chain,
                                  stationary_distribution, train_markov, unigram_kl)

SPECTRA = [([0.5, -0.4], [0.5, 0.3, 0.2]), ([0.2, 0.1, 0.0, -0.1], None)]   # the notebook checks the 4-state chains


@pytest.mark.parametrize("lam,pi", SPECTRA)
def test_chain_has_the_asked_spectrum_and_stationary(lam, pi):
    T = markov_chain(lam, stationary=pi, seed=1)
    n = len(lam) + 1
    assert T.shape == (n, n) and np.allclose(T.sum(1), 1) and T.min() >= 0.02
    got = np.sort_complex(nontrivial_eigenvalues(T))
    assert np.allclose(got, np.sort_complex(np.array(lam, dtype=complex)), atol=1e-8)
    want_pi = np.full(n, 1 / n) if pi is None else np.array(pi)
    assert np.allclose(stationary_distribution(T), want_pi)


def test_entropy_rate_closed_forms():
    assert abs(entropy_rate(np.full((4, 4), 0.25)) - np.log(4)) < 1e-12       # i.i.d. uniform
    assert abs(unigram_kl(np.full((4, 4), 0.25))) < 1e-12                     # nothing to predict
    P = np.roll(np.eye(3), 1, axis=1) * 0.9 + 0.1 / 3                         # near-deterministic cycle
    assert entropy_rate(P) < 0.5 < unigram_kl(P)


def test_training_is_deterministic_with_two_threads():
    "With two CPU threads two runs of one seed ended with different weights here; train runs CPU steps on one thread."
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        T = markov_chain(*CHAINS["real"])
        a, _ = train_markov(T, seed=0, steps=20, d_model=32, seq_len=16, batch=64)
        b, _ = train_markov(T, seed=0, steps=20, d_model=32, seq_len=16, batch=64)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
        assert torch.get_num_threads() == 2, "train must restore the thread count"
    finally:
        torch.set_num_threads(n)


def test_paper_preset_dry_run():
    """The chapter's steps at the `paper` preset's sizes, on CPU and tiny data: one training step per model, one
    ACE batch, the report, and the across-seed and merging functions. A shape error shows here, not after an
    hour on a GPU."""
    S = SIZES.at("paper")
    kw = dict(steps=1, d_model=S.d_model, n_heads=S.n_heads, d_mlp=S.d_mlp, seq_len=S.seq_len, batch=S.batch,
              lr=S.lr, log_every=S.log_every)
    for name, spec in CHAINS.items():
        T = markov_chain(*spec)
        assert rank_k_kl(T, 2)[0] > S.thr_suff and rank_k_kl(T, 1)[1] < S.thr_necessary * unigram_kl(T)
        tiny = sample_chain(T, 8, S.seq_len, torch.Generator().manual_seed(0))        # [8, seq_len]
        models = [train_markov(T, seed, eval_tokens=tiny, **kw) for seed in (0, 1)]
        reps = [markov_core_report(m, T, tiny, tiny, tiny, ks=S.ks, seed=s) for s, (m, _) in enumerate(models)]
        for (m, log), rep in zip(models, reps):
            assert len(log["step"]) >= 1 and np.isfinite(log["kl"]).all()
            assert rep.core.basis.shape == (S.d_model, 3) and len(rep.eigenvalues) == 3
            assert rep.sweep["ace"].ks == [1, 2, 3] and rep.sweep["random"].ks == list(S.ks)
            assert np.isfinite(rep.sweep["pca"].keep).all() and np.isfinite(rep.eig_error)
        (A, _), (B, _) = models
        acts = [record_activation(m, HOOK, tiny)[0].reshape(-1, S.d_model).double() for m, _ in models]
        assert 0 <= projector_overlap(reps[0].core, reps[1].core) <= 1 + 1e-9
        assert cca(reps[0].core.coords(acts[0]), reps[1].core.coords(acts[1])).shape == (3,)
        assert np.isfinite(weight_cosine(A, B, matrices_only=True))
        R = core_aligned_rotation(acts[0], acts[1], reps[0].core, reps[1].core)
        assert np.isfinite(markov_metrics(interpolate(A, rotate_residual(B, R), 0.5), T, tiny)["eval_loss"])
    m_ln, _ = train_markov(T, 0, normalization_type="LN", **kw)
    rep_ln = markov_core_report(m_ln, T, tiny, tiny, tiny, ks=(3,), gramian=True)
    assert len(rep_ln.sv_gramian) > 3 and 0 <= rep_ln.overlap_gramian <= 1 + 1e-9
