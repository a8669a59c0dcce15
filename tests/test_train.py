"Unit tests for coreinv.train: model construction, the training loop (determinism, resume), weight-space maps."
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coreinv.train import (TrainLog, fold_layernorm, interpolate, make_transformer, rotate_residual,
                           train)


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


def test_make_transformer_seeded_and_shapes():
    a, b, c = small(1), small(1), small(2)
    assert same(a, b) and not same(a, c)
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


def test_train_deterministic():
    a, b = small(), small()
    train(a, copy_batch, copy_loss, **KW)
    train(b, copy_batch, copy_loss, **KW)
    assert same(a, b)


def test_train_does_not_touch_global_rng():
    state = torch.get_rng_state()
    train(small(), copy_batch, copy_loss, **KW)
    assert torch.equal(state, torch.get_rng_state())


class Killed(Exception):
    pass


def killing(at):
    n = dict(calls=0)
    def fn(gen):
        n["calls"] += 1
        if n["calls"] == at:
            raise Killed
        return copy_batch(gen)
    return fn


def test_resume_after_kill_is_bitwise_identical(tmp_path):
    straight = small()
    log_a = train(straight, copy_batch, copy_loss, **KW)
    with pytest.raises(Killed):                      # killed during step 24; checkpoints at 10 and 20
        train(small(), killing(24), copy_loss, checkpoint_dir=tmp_path, checkpoint_every=10, **KW)
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["step"] == 20
    resumed = small(seed=7)                          # even other initial weights: the checkpoint wins
    log_b = train(resumed, copy_batch, copy_loss, checkpoint_dir=tmp_path, checkpoint_every=10, **KW)
    assert same(straight, resumed)
    assert np.array_equal(log_a["loss"][1:], log_b["loss"][1:])
    assert not list(tmp_path.glob("*.tmp"))          # the atomic write left no temporary file


def test_resume_refuses_other_hyperparameters(tmp_path):
    train(small(), copy_batch, copy_loss, checkpoint_dir=tmp_path, **KW)
    with pytest.raises(ValueError, match="written with"):
        train(small(), copy_batch, copy_loss, checkpoint_dir=tmp_path, **(KW | dict(lr=0.5)))


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


def test_trainlog_columns():
    log = TrainLog()
    log.append(step=0, x=1.0)
    log.append(step=5, x=2.0)
    assert np.array_equal(log["x"], [1.0, 2.0]) and len(log) == 2
    with pytest.raises(KeyError):
        log["y"]


def rotation_fixing_ones(D, seed):
    g = torch.Generator().manual_seed(seed)
    n = torch.ones(D, 1, dtype=torch.float64) / math.sqrt(D)
    Q, _ = torch.linalg.qr(torch.cat([n, torch.randn(D, D - 1, generator=g, dtype=torch.float64)], 1))
    O, _ = torch.linalg.qr(torch.randn(D - 1, D - 1, generator=g, dtype=torch.float64))
    return n @ n.T + Q[:, 1:] @ O @ Q[:, 1:].T


def test_fold_and_rotate_preserve_function():
    m = make_transformer(2, 16, 2, 5, 8, seed=3)
    x = torch.randint(0, 5, (4, 8), generator=torch.Generator().manual_seed(0))
    f = fold_layernorm(m)
    r = rotate_residual(f, rotation_fixing_ones(16, 1))
    with torch.no_grad():
        assert torch.allclose(f(x).log_softmax(-1), m(x).log_softmax(-1), atol=1e-4)
        assert torch.allclose(r(x), f(x), atol=1e-4)
    assert not torch.allclose(r.W_E, f.W_E, atol=1e-3)


def test_rotate_without_normalisation_any_orthogonal():
    m = make_transformer(1, 16, 2, 5, 8, seed=3, normalization_type=None)
    R, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2)))
    x = torch.randint(0, 5, (4, 8))
    with torch.no_grad():
        assert torch.allclose(rotate_residual(m, R)(x), m(x), atol=1e-4)


def test_rotate_refuses():
    m = make_transformer(1, 16, 2, 5, 8)
    R = rotation_fixing_ones(16, 0)
    with pytest.raises(ValueError, match="fold_layernorm"):
        rotate_residual(m, R)
    f = fold_layernorm(m)
    with pytest.raises(ValueError, match="orthogonal"):
        rotate_residual(f, 2 * R)
    with pytest.raises(ValueError, match="all-ones"):
        Q, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))
        rotate_residual(f, Q)
    with pytest.raises(ValueError, match="d_model"):
        rotate_residual(f, torch.eye(8))


def test_interpolate_endpoints_and_midpoint():
    a, b = small(0), small(1)
    assert same(interpolate(a, b, 0.0), a)
    assert torch.allclose(interpolate(a, b, 1.0).W_U, b.W_U)
    assert torch.allclose(interpolate(a, b, 0.25).W_in, 0.75 * a.W_in + 0.25 * b.W_in)
    with pytest.raises(ValueError):
        interpolate(a, make_transformer(1, 32, 2, 4, 8), 0.5)
