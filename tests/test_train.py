"""Unit tests for coreinv.train beyond the notebook's own checks: initialisation scale, refusals, the log's
step grid, the global RNG, finished runs, the steps the callback sees and where it stops, and threads.
The weight-space maps (coreinv.merge) are tested in nbs/14_merge.ipynb."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coreinv.train import make_transformer, train


def copy_batch(gen):
    return torch.randint(0, 4, (32, 8), generator=gen)


def copy_loss(model, tokens):
    logits = model(tokens)
    return F.cross_entropy(logits[:, 1:].reshape(-1, 4), tokens[:, :-1].reshape(-1))


def small(seed=0):
    return make_transformer(1, 16, 2, 4, 8, seed=seed)


KW = dict(steps=30, lr=1e-2, schedule="onecycle", weight_decay=0.1, log_every=5, progress=False)


def same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_make_transformer_shapes():
    a = small(1)
    assert a.cfg.d_head == 8 and a.cfg.d_mlp == 64 and a.cfg.n_layers == 1
    assert tuple(a.W_E.shape) == (4, 16)


def test_make_transformer_init_std():
    m = make_transformer(1, 64, 4, 4, 8, init_std=0.3)
    assert abs(m.W_in.std().item() - 0.3) < 0.02
    assert abs(make_transformer(1, 64, 4, 4, 8).W_in.std().item() - 0.1) < 0.01


@pytest.mark.parametrize("bad", [dict(n_heads=3), dict(normalization_type="BN"), dict(init_std=-1.0),
                                 dict(d_vocab=0)])
def test_make_transformer_refuses(bad):
    kw = dict(n_layers=1, d_model=16, n_heads=2, d_vocab=4, n_ctx=8) | bad
    with pytest.raises(ValueError):
        make_transformer(**kw)


def test_train_learns_and_logs():
    m = small()
    log = train(m, copy_batch, copy_loss, eval_fn=lambda mm: {"e": 1.0}, **(KW | dict(steps=100)))
    assert log["loss"][-1] < 0.3 * math.log(4)
    assert np.array_equal(log["step"], np.arange(0, 101, 5))
    assert math.isnan(log["loss"][0]) and log["e"][-1] == 1.0
    assert np.all(log["weight_norm"] > 0)


def test_train_does_not_touch_global_rng():
    state = torch.get_rng_state()
    train(small(), copy_batch, copy_loss, **KW)
    assert torch.equal(state, torch.get_rng_state())


def test_finished_run_returns_at_once(tmp_path):
    m = small()
    train(m, copy_batch, copy_loss, checkpoint_dir=tmp_path, **KW)
    again = small()
    train(again, lambda g: (_ for _ in ()).throw(AssertionError("no batch may be drawn")), copy_loss,
          checkpoint_dir=tmp_path, **KW)
    assert same(m, again)


@pytest.mark.parametrize("bad", [dict(steps=0), dict(schedule="cosine"), dict(log_every=0),
                                 dict(checkpoint_every=5)])
def test_train_refuses(bad):
    with pytest.raises(ValueError):
        train(small(), copy_batch, copy_loss, **(KW | bad))


def test_callback_sees_every_step_and_stops():
    seen = []
    def cb(step, model, row):
        seen.append((step, row is not None))
        return False
    train(small(), copy_batch, copy_loss, callback=cb, **(KW | dict(steps=20)))
    assert [s for s, _ in seen] == list(range(21)) and [s for s, logged in seen if logged] == [0, 5, 10, 15, 20]
    log = train(small(), copy_batch, copy_loss, callback=lambda s, m, r: s == 7, **KW)
    assert log.last["step"] == 5                     # stopped at step 7, after the row of step 5


def test_threads_are_set_during_the_run_and_restored():
    n = torch.get_num_threads()
    during = []
    train(small(), copy_batch, copy_loss, callback=lambda s, m, r: during.append(torch.get_num_threads()) or False,
          threads=1, **(KW | dict(steps=3)))
    assert set(during) == {1} and torch.get_num_threads() == n
    with pytest.raises(ValueError):
        train(small(), copy_batch, copy_loss, threads=0, **KW)
