"""coreinv.tasks.sae_gap on planted cases: the trigram baseline reaches the loss computed by hand on a
deterministic cycle and cannot on its reversed (reordered) twin; an LM's loss is log V for equal logits and
near 0 for a model that knows the next token; windows start at <bos>; the roster lists every dictionary;
bad input is a ValueError naming the cause."""
import numpy as np
import pytest
import torch

from coreinv.koopman import EDMDc
from coreinv.tasks.sae_gap import dictionary_roster, fit_on, lm_loss, sae_dictionary, trigram_loss, windows


class Vocab:
    "A planted vocabulary: ids 0 … V-1, <bos> = 0; a sentence is a list of ids."
    bos_id = 0

    def __init__(self, V):
        self.V = V

    def __len__(self):
        return self.V

    def encode_corpus(self, sentences):
        return np.asarray([t for s in sentences for t in [0, *s]], dtype=np.int64)


N, V = 50, 5                        # 50 sentences "1 2 3": the stream 0 1 2 3 0 1 2 3 …; id 4 never occurs
CYCLE = [[1, 2, 3]] * N
UNI = (N + 1) / (4 * N + V)         # add-one unigram probability of each of 0 … 3


def test_trigram_reaches_the_hand_computed_loss_on_a_cycle_and_not_on_its_reversed_twin():
    vocab = Vocab(V)
    seen = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]] * 3)
    # every (a, b) has one successor, and so has every b: p = w0 + w1 + w2 · unigram
    assert trigram_loss(vocab, CYCLE, seen) == pytest.approx(-np.log(0.6 + 0.3 + 0.1 * UNI), rel=1e-12)
    assert trigram_loss(vocab, CYCLE, seen, weights=(0.2, 0.2, 0.6)) == pytest.approx(
        -np.log(0.4 + 0.6 * UNI), rel=1e-12)
    # the twin: the same tokens in the reversed order; no trigram or bigram of it was seen
    twin = torch.tensor([[0, 3, 2, 1, 0, 3, 2, 1]] * 3)
    assert trigram_loss(vocab, CYCLE, twin) == pytest.approx(-np.log(0.1 * UNI), rel=1e-12)
    # a shuffled training text (same unigram counts) cannot reach the cycle's loss
    rng = np.random.default_rng(0)
    shuffled = [list(rng.permutation([1, 2, 3, 1, 2, 3, 1, 2, 3])[:3]) for _ in range(N)]
    assert trigram_loss(vocab, shuffled, seen) > trigram_loss(vocab, CYCLE, seen) + 0.2
    # numpy windows score the same as a tensor
    assert trigram_loss(vocab, CYCLE, seen.numpy()) == trigram_loss(vocab, CYCLE, seen)


def test_lm_loss_is_log_v_for_equal_logits_and_near_zero_for_a_model_that_knows_the_next_token():
    toks = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]] * 2)
    assert lm_loss(lambda t: torch.zeros(*t.shape, V), toks) == pytest.approx(np.log(V), abs=1e-6)
    nxt = torch.tensor([1, 2, 3, 0, 0])                           # the cycle's next token after each id
    knows = lambda t: 30.0 * torch.nn.functional.one_hot(nxt[t], V).float()
    assert lm_loss(knows, toks) < 1e-9
    # only positions 1 … T-2 predict (the token after <bos> is not scored): a wrong first guess is free
    first_wrong = lambda t: knows(t) * (torch.arange(t.shape[1]) > 0)[None, :, None]
    assert lm_loss(first_wrong, toks) < 1e-9


def test_windows_start_at_bos_and_have_the_asked_shape():
    vocab = Vocab(V)
    sents = [[1, 2, 3], [1, 2], [1, 2, 3, 4], [2]] * 5
    toks, starts = windows(vocab, sents, n_windows=7, n_ctx=6)
    stream = vocab.encode_corpus(sents)
    assert toks.shape == (7, 6) and toks.dtype == torch.int64
    assert (toks[:, 0] == 0).all() and (stream[starts] == 0).all() and (np.diff(starts) > 0).all()
    assert np.array_equal(starts, np.flatnonzero(stream == 0)[:7])
    for t, s in zip(toks.numpy(), starts):
        assert np.array_equal(t, stream[s:s + 6])


def test_bad_input_is_a_value_error_naming_the_cause():
    vocab = Vocab(V)
    with pytest.raises(ValueError, match="fewer than the 30 asked for"):
        windows(vocab, CYCLE[:20], n_windows=30, n_ctx=8)
    with pytest.raises(ValueError, match="n_ctx"):
        windows(vocab, CYCLE, n_windows=3, n_ctx=0)
    with pytest.raises(ValueError, match="n_windows"):
        windows(vocab, CYCLE, n_windows=0, n_ctx=4)
    seen = torch.tensor([[0, 1, 2, 3]])
    for w in [(0.5, 0.5, 0.0), (0.6, 0.3), (0.7, 0.3, 0.1), (-0.1, 1.0, 0.1)]:
        with pytest.raises(ValueError, match="weights"):
            trigram_loss(vocab, CYCLE, seen, weights=w)
    with pytest.raises(ValueError, match="shape"):
        trigram_loss(vocab, CYCLE, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="vocabulary"):
        trigram_loss(vocab, CYCLE, torch.tensor([[0, 1, 2, 7]]))
    with pytest.raises(ValueError, match="at least 3"):
        trigram_loss(vocab, [[]], seen)
    with pytest.raises(ValueError, match="shape"):
        lm_loss(lambda t: torch.zeros(*t.shape, V), torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="same number"):
        dictionary_roster(4, {"relu": [object()], "topk": []}, np.zeros((10, 4)), 16)
    with pytest.raises(ValueError, match="r must be"):
        dictionary_roster(0, {"relu": [object()]}, np.zeros((10, 4)), 16)


@pytest.fixture(scope="module")
def tiny():
    from coreinv.sae import SparseAutoencoder
    rng = np.random.default_rng(0)
    X, U = rng.standard_normal((300, 8)), 0.1 * rng.standard_normal((300, 8))
    saes = {kind: [SparseAutoencoder(kind, expansion_factor=2, k=2, steps=20, batch_size=64, seed=s,
                                     progress=False).fit(X).sae_ for s in range(2)] for kind in ("relu", "topk")}
    return X, U, X + U + 0.1 * np.tanh(X), saes


def test_roster_lists_every_dictionary_in_order_and_the_null_fires_like_the_latents(tiny):
    X, U, Y, saes = tiny
    roster = dictionary_roster(4, saes, X, n_rff=16)
    per_kind = [f"{p} {k}{t}" for k in ("relu", "topk") for p, t in (
        ("SAE", ", variance"), ("null", ", variance"), ("SAE", ", frequency"), ("null", ", frequency"),
        ("spectral on SAE", ""))]
    assert list(roster) == per_kind + ["random", "PCA", "spectral on identity", "RFF", "spectral on RFF"]
    assert {n: len(v) for n, v in roster.items() if len(v) != 2} == {"PCA": 1, "spectral on identity": 1}
    d = sae_dictionary(saes["topk"][1], 4, "frequency", X)
    null = roster["null topk, frequency"][1]
    assert np.array_equal(null.frequencies, np.clip(d.frequency_[d.latents_], 1 / len(X), 1)) and null.seed == 1
    assert roster["SAE topk, frequency"][1].encoder is saes["topk"][1]


def test_fit_on_is_edmdc_on_the_fitted_dictionary_and_the_chosen_rows(tiny):
    X, U, Y, saes = tiny
    d, rows = sae_dictionary(saes["topk"][0], 4, "variance", X), np.arange(0, 300, 2)
    ref = EDMDc(d, fit_dictionary=False, ridge=1e-8, progress=False).fit(X[rows], U[rows], Y[rows])
    assert np.array_equal(fit_on(d, X, U, Y, rows).A_, ref.A_)
