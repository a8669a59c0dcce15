"""Tests for coreinv.tasks.modular beyond the notebook's own checks (nbs/22_tasks_modular.ipynb, run by
nbval): more bad inputs, exact Fourier powers, censoring in the scaling fit, rotations of scaled codes,
resuming a killed run, and core_at's bisection against a full sweep."""
import math

import numpy as np
import pytest
import torch

import coreinv.tasks.modular as mod
from coreinv.identify import operator_spectrum
from coreinv.tasks.modular import (active_frequencies, core_at, fit_scaling_law, frequency_power, log_columns,
                                   make_modular_model, modular_data, predict_tau, rotation_summary, shift_operator,
                                   track_cores, train_modular)

TINY = dict(n_layers=1, d_model=16, n_heads=2, d_mlp=32)


@pytest.fixture(autouse=True)
def one_thread():
    "Tiny models: one intra-op thread (on a shared 2-core machine more threads only contend)."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("kw", [dict(p=2, train_frac=0.5), dict(p=7, train_frac=0.0), dict(p=7, train_frac=1.0),
                                dict(p=7.0, train_frac=0.5)])
def test_modular_data_refuses_bad_input(kw):
    with pytest.raises(ValueError):
        modular_data(**kw)


def test_frequency_power_finds_planted_frequencies():
    p, x = 17, torch.arange(17.)
    W = torch.stack([torch.cos(2 * math.pi * 4 * x / p), torch.sin(2 * math.pi * 4 * x / p),
                     torch.cos(2 * math.pi * 7 * x / p) * 0.7, torch.full((p,), 3.0)], 1)
    power = frequency_power(W)
    assert power.shape == (8,) and abs(power.sum() - 1) < 1e-12
    assert active_frequencies(power) == [4, 7]
    assert power[3] == pytest.approx(1 / 1.245) and power[6] == pytest.approx(0.245 / 1.245)   # cos+sin vs 0.7² cos
    # the constant column contributes nothing; a column rotation changes nothing
    Q = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))[0]
    assert np.allclose(frequency_power(W @ Q), power)
    with pytest.raises(ValueError):
        frequency_power(torch.randn(17))
    with pytest.raises(ValueError):
        active_frequencies(power, rel=0.0)


def test_fit_scaling_law_recovers_exponents_and_handles_censoring():
    om, pp = np.meshgrid([0.5, 1, 2, 4], [19, 23, 31, 43])
    tau = 3000 / (om ** 1.0 * pp ** 0.5)
    fit = fit_scaling_law(om, pp, tau, n_boot=100)
    assert abs(fit["alpha"] - 1) < 1e-9 and abs(fit["beta"] - 0.5) < 1e-9
    assert np.allclose(predict_tau(fit, om, pp), tau)
    noisy = tau * np.exp(0.2 * np.random.default_rng(1).standard_normal(tau.shape))
    f2 = fit_scaling_law(om, pp, noisy, n_boot=300)
    assert f2["alpha_ci"][0] < f2["alpha"] < f2["alpha_ci"][1]
    cens = tau > 600
    budgeted = fit_scaling_law(om, pp, np.minimum(tau, 600), cens, n_boot=50)
    dropped = fit_scaling_law(om, pp, np.minimum(tau, 600), cens, how="drop", n_boot=50)
    assert budgeted["n_censored"] == cens.sum() and dropped["n_runs"] == (~cens).sum()
    assert budgeted["alpha"] < 1                              # censoring at the budget flattens the slope
    with pytest.raises(ValueError):
        fit_scaling_law([1, 2, 4], [31, 31, 31], [10, 5, 2])   # one p: β undetermined
    with pytest.raises(ValueError):
        fit_scaling_law([1, 2], [31, 41], [10, -1])


def test_shift_operator_of_exact_rotation_codes():
    p = 13
    s = (torch.arange(p).repeat_interleave(p) + torch.arange(p).repeat(p)).double()
    Z = torch.stack([g(2 * math.pi * f * s / p) for f in (3, 4) for g in (torch.cos, torch.sin)], 1)
    ev = operator_spectrum(shift_operator(Z, p))
    r = rotation_summary(ev, p, [3, 4])
    assert r["unit_dev"] < 1e-9 and r["angle_err"] < 1e-9
    assert rotation_summary(ev, p, [5])["angle_err"] > 0.2
    # codes of a only, scaled, in a rotated basis: still rotations at the same angles
    Za = torch.stack([torch.cos(2 * math.pi * 2 * torch.arange(p).repeat_interleave(p).double() / p),
                      torch.sin(2 * math.pi * 2 * torch.arange(p).repeat_interleave(p).double() / p)], 1) * 5
    R = torch.tensor([[0.6, -0.8], [0.8, 0.6]], dtype=torch.float64)
    assert rotation_summary(operator_spectrum(shift_operator(Za @ R, p)), p, [2])["angle_err"] < 1e-9
    with pytest.raises(ValueError):
        shift_operator(Z[:-1], p)


def _train_tiny(steps=40, **kw):
    data = modular_data(7, 0.6, seed=0)
    model = make_modular_model(7, seed=0, **TINY)
    log, snaps = train_modular(model, data, steps, lr=1e-2, log_every=10, progress=False, **kw)
    return model, data, log, snaps


def test_train_modular_resumes_after_a_kill(tmp_path, monkeypatch):
    straight, data, log_a, snaps_a = _train_tiny(snapshot_every=10)
    real = mod.evaluate
    calls = {"n": 0}

    def dying(model, data):
        calls["n"] += 1
        if calls["n"] == 4:                                   # step 30: after the step-20 checkpoint
            raise KeyboardInterrupt
        return real(model, data)

    monkeypatch.setattr(mod, "evaluate", dying)
    with pytest.raises(KeyboardInterrupt):
        _train_tiny(snapshot_every=10, checkpoint_dir=tmp_path, checkpoint_every=20)
    monkeypatch.setattr(mod, "evaluate", real)
    resumed, _, log_b, snaps_b = _train_tiny(snapshot_every=10, checkpoint_dir=tmp_path, checkpoint_every=20)
    assert all(torch.equal(p, q) for p, q in zip(straight.parameters(), resumed.parameters()))
    assert list(snaps_b) == list(snaps_a) == [0, 10, 20, 30, 40]
    assert torch.equal(snaps_b[30]["embed.W_E"], snaps_a[30]["embed.W_E"])
    assert np.allclose(log_columns(log_b)["test_acc"], log_columns(log_a)["test_acc"])


def test_core_at_bisection_agrees_with_a_sweep():
    model, data, log, snaps = _train_tiny(steps=40, snapshot_every=20)
    r = core_at(model, data, "blocks.0.hook_resid_post")
    assert r.pca_dims.ks[-1] == 16
    # the bisection's answer is the smallest sufficient k of a full sweep
    ev = mod.hook_evaluator(model, "blocks.0.hook_resid_post", data.tokens[data.test], mod.answer_accuracy(7), pos=-1)
    full = mod.core_dims(ev, r.ace, r.ace_dims.ks, r.test_acc, 1 / 7, 0.95 * r.test_acc, 2 / 7, thresholds="raw",
                         higher_is_better=True)
    k = r.ace_dims.k_sufficient                        # a sufficient k, or None when the largest k is not
    assert (k is None) == (full.keep[-1] < 0.95 * r.test_acc)
    assert k is None or full.keep[full.ks.index(k)] >= 0.95 * r.test_acc
    rows = track_cores(model, {40: snaps[40]}, data, progress=False)   # the same numbers at the last snapshot
    assert rows[0].cores[0].ace_dims == r.ace_dims and rows[0].cores[0].test_acc == r.test_acc


