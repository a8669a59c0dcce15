"Unit tests for coreinv.tasks.markov: chain construction, sampling, Bayes scores, the training recipe."
import numpy as np
import pytest
import torch

from coreinv.tasks.markov import (accuracy, bayes_next, entropy_rate, kl_to_bayes, markov_chain,
                                  markov_core_report, markov_metrics, next_token_loss,
                                  nontrivial_eigenvalues, sample_chain, stationary_distribution,
                                  train_markov, unigram_kl)

SPECTRA = [([0.6, 0.3, -0.2], [0.4, 0.3, 0.2, 0.1]), ([0.3 + 0.4j, 0.3 - 0.4j, -0.1], None),
           ([0.5, -0.4], [0.5, 0.3, 0.2]), ([0.2, 0.1, 0.0, -0.1], None)]


@pytest.mark.parametrize("lam,pi", SPECTRA)
def test_chain_has_the_asked_spectrum_and_stationary(lam, pi):
    T = markov_chain(lam, stationary=pi, seed=1)
    n = len(lam) + 1
    assert T.shape == (n, n) and np.allclose(T.sum(1), 1) and T.min() >= 0.02
    got = np.sort_complex(nontrivial_eigenvalues(T))
    assert np.allclose(got, np.sort_complex(np.array(lam, dtype=complex)), atol=1e-8)
    want_pi = np.full(n, 1 / n) if pi is None else np.array(pi)
    assert np.allclose(stationary_distribution(T), want_pi)


def test_real_chain_is_reversible_complex_is_not():
    pi = np.array([0.4, 0.3, 0.2, 0.1])
    flow = np.diag(pi) @ markov_chain([0.6, 0.3, -0.2], stationary=pi)
    assert np.allclose(flow, flow.T)
    Tc = markov_chain([0.3 + 0.4j, 0.3 - 0.4j, -0.1])
    assert not np.allclose(Tc, Tc.T)


@pytest.mark.parametrize("bad", [dict(nontrivial=[1.0, 0.2]), dict(nontrivial=[0.2 + 0.3j, 0.1]),
                                 dict(nontrivial=[0.2, 0.1], stationary=[0.6, 0.6, -0.2]),
                                 dict(nontrivial=[0.5 + 0.4j, 0.5 - 0.4j, -0.3], max_tries=300)])
def test_chain_refuses(bad):
    with pytest.raises(ValueError):
        markov_chain(**bad)


@pytest.fixture(scope="module")
def chain():
    return markov_chain([0.6, 0.3, -0.2], stationary=[0.4, 0.3, 0.2, 0.1])


def test_sample_statistics(chain):
    x = sample_chain(chain, 3000, 24, torch.Generator().manual_seed(0))
    assert x.shape == (3000, 24) and x.dtype == torch.long
    counts = np.zeros((4, 4))
    np.add.at(counts, (x[:, :-1].numpy(), x[:, 1:].numpy()), 1)
    assert np.abs(counts / counts.sum(1, keepdims=True) - chain).max() < 0.015
    assert np.abs(np.bincount(x[:, -1].numpy(), minlength=4) / 3000 - [0.4, 0.3, 0.2, 0.1]).max() < 0.03
    y = sample_chain(chain, 3000, 24, torch.Generator().manual_seed(0))
    assert torch.equal(x, y)


def test_bayes_scores_known_answers(chain):
    x = sample_chain(chain, 2000, 16, torch.Generator().manual_seed(3))
    logits = bayes_next(chain, x).log().float()
    assert kl_to_bayes(logits, x, chain) < 1e-6
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 4), x[:, 1:].reshape(-1)).item()
    assert abs(ce - entropy_rate(chain)) < 0.015
    assert abs(accuracy(logits, x) - (stationary_distribution(chain) * chain.max(1)).sum()) < 0.015
    pi_logits = torch.log(torch.tensor(stationary_distribution(chain))).float().expand(2000, 16, 4)
    assert abs(kl_to_bayes(pi_logits, x, chain) - unigram_kl(chain)) < 0.005
    assert kl_to_bayes(torch.zeros(2000, 16, 4), x, chain) > unigram_kl(chain)  # uniform is worse than π


def test_entropy_rate_closed_forms():
    assert abs(entropy_rate(np.full((4, 4), 0.25)) - np.log(4)) < 1e-12       # i.i.d. uniform
    assert abs(unigram_kl(np.full((4, 4), 0.25))) < 1e-12                     # nothing to predict
    P = np.roll(np.eye(3), 1, axis=1) * 0.9 + 0.1 / 3                         # near-deterministic cycle
    assert entropy_rate(P) < 0.5 < unigram_kl(P)


def test_kl_refuses_bad_shapes(chain):
    x = sample_chain(chain, 4, 8)
    with pytest.raises(ValueError, match="expected"):
        kl_to_bayes(torch.zeros(4, 8, 5), x, chain)


def test_next_token_loss_uniform_is_log_n(chain):
    class Uniform(torch.nn.Module):
        def forward(self, tokens):
            return torch.zeros(*tokens.shape, 4, requires_grad=True)
    x = sample_chain(chain, 8, 8)
    assert abs(next_token_loss(Uniform(), x).item() - np.log(4)) < 1e-6


KW = dict(steps=120, d_model=32, seq_len=12, batch=64, log_every=40)


@pytest.fixture(scope="module")
def trained(chain):
    ev = sample_chain(chain, 128, 12, torch.Generator().manual_seed(9))
    m, log = train_markov(chain, seed=0, eval_tokens=ev, **KW)
    return m, log, ev


def test_train_markov_learns_and_is_seeded(chain, trained):
    m, log, ev = trained
    assert log["kl"][-1] < 0.03 and log["kl"][-1] < 0.2 * log["kl"][0]
    assert abs(markov_metrics(m, chain, ev)["kl"] - log["kl"][-1]) < 1e-9
    m2, _ = train_markov(chain, seed=0, eval_tokens=ev, **KW)
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), m2.parameters()))


def test_core_report(chain, trained):
    m, log, ev = trained
    r = markov_core_report(m, chain, ev[:16], ev, ev, ks=(1, 3, 5))
    assert len(r.sv) <= 3                              # 4 centred outputs: rank ≤ 3
    assert r.sweep["ace"].ks == [1, 3] and r.sweep["pca"].ks == [1, 3, 5]
    assert r.sweep["ace"].remove[1] > 0.5 * unigram_kl(chain)
    assert r.sweep["ace"].keep[1] < r.sweep["random"].keep[1]
    assert len(r.eigenvalues) == 3 and r.eig_error < 0.3
    with pytest.raises(ValueError):                    # linear readout: the Gramian form vanishes
        markov_core_report(m, chain, ev[:8], ev, ev, ks=(3,), gramian=True)


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
