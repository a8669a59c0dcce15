"""Tests for coreinv.tasks.markov beyond the notebook's own checks (nbs/21_tasks_markov.ipynb, run by nbval):
chains of other sizes and spectra, closed-form entropy rates, and seeded training on two CPU threads."""
import numpy as np
import pytest
import torch

from coreinv.tasks.markov import (entropy_rate, markov_chain, nontrivial_eigenvalues, stationary_distribution,
                                  train_markov, unigram_kl)

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
        T = markov_chain([0.6, 0.3, -0.2], stationary=[0.4, 0.3, 0.2, 0.1])
        a, _ = train_markov(T, seed=0, steps=20, d_model=32, seq_len=16, batch=64)
        b, _ = train_markov(T, seed=0, steps=20, d_model=32, seq_len=16, batch=64)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
        assert torch.get_num_threads() == 2, "train must restore the thread count"
    finally:
        torch.set_num_threads(n)
