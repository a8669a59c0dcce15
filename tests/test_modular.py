"""Tests for coreinv.tasks.modular: the a + b mod p task, its Fourier analysis, grokking times,
rotations in the core, the scaling-law fit, and the full-batch training wrapper."""
import math

import numpy as np
import pytest
import torch

import coreinv.tasks.modular as mod
from coreinv.identify import operator_spectrum
from coreinv.tasks.modular import (active_frequencies, core_at, fit_scaling_law, first_step,
                                   fourier_basis, frequency_power, grokking_sweep, grokking_times,
                                   log_columns, make_modular_model, modular_data, pick_steps, predict_tau,
                                   rotation_summary, shift_operator, track_cores, train_modular)

TINY = dict(n_layers=1, d_model=16, n_heads=2, d_mlp=32)


@pytest.fixture(autouse=True)
def one_thread():
    "Tiny models: one intra-op thread (on a shared 2-core machine more threads only contend)."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_modular_data_is_the_task_and_a_seeded_partition():
    d = modular_data(11, 0.3, seed=4)
    a, b, eq = d.tokens.T
    assert (eq == 11).all() and torch.equal(d.labels, (a + b) % 11)
    assert torch.equal(d.tokens[5 * 11 + 9], torch.tensor([5, 9, 11]))
    assert sorted(torch.cat([d.train, d.test]).tolist()) == list(range(121))
    assert len(d.train) == round(0.3 * 121)
    assert torch.equal(modular_data(11, 0.3, seed=4).train, d.train)
    assert not torch.equal(modular_data(11, 0.3, seed=5).train, d.train)


@pytest.mark.parametrize("kw", [dict(p=2, train_frac=0.5), dict(p=7, train_frac=0.0), dict(p=7, train_frac=1.0),
                                dict(p=7.0, train_frac=0.5)])
def test_modular_data_refuses_bad_input(kw):
    with pytest.raises(ValueError):
        modular_data(**kw)


@pytest.mark.parametrize("p", [10, 13])
def test_fourier_basis_is_orthonormal(p):
    B = fourier_basis(p)
    assert torch.allclose(B @ B.T, torch.eye(p, dtype=torch.float64), atol=1e-12)


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


def test_grokking_times_known_answer_and_censoring():
    log = {"step": [0, 10, 20, 30, 40, 50], "train_acc": [0, 0.5, 1, 1, 1, 1], "test_acc": [0, 0, .1, .2, .96, .99]}
    assert grokking_times(log) == {"tau_fit": 20, "tau_grok": 40, "delay_ratio": 1.0}
    assert grokking_times({**log, "test_acc": [0] * 6})["tau_grok"] is None
    assert first_step([1, 2, 3], [0.1, 0.2, 0.3], 0.5) is None
    with pytest.raises(ValueError):
        grokking_times({"step": [0]})


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


def test_pick_steps():
    steps = pick_steps(range(0, 5001, 50), 10, include=[333])
    assert steps[0] == 0 and steps[-1] == 5000 and 350 in steps and len(steps) <= 11


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


def test_train_modular_learns_and_stops():
    _, _, log, _ = _train_tiny(steps=60)
    c = log_columns(log)
    assert c["train_loss"][-1] < 0.5 * c["train_loss"][0] and list(c["step"]) == [0, 10, 20, 30, 40, 50, 60]
    _, _, log2, _ = _train_tiny(steps=60, stop_at=0.0)
    assert list(log_columns(log2)["step"]) == [0]
    with pytest.raises(ValueError):
        _train_tiny(snapshot_every=0)
    with pytest.raises(ValueError):
        _train_tiny(stop_at=0.9, checkpoint_dir="x")


def test_core_at_and_track_cores_on_a_tiny_run():
    model, data, log, snaps = _train_tiny(steps=40, snapshot_every=20)
    r = core_at(model, data, "blocks.0.hook_resid_post")
    assert r.ace_dims.ks[-1] <= data.p - 1 and r.pca_dims.ks[-1] == 16
    for d in (r.ace_dims, r.pca_dims):
        for k in (d.k_sufficient, d.k_necessary):
            assert k is None or 1 <= k <= d.ks[-1]
    assert r.test_acc == pytest.approx(float((mod.answer_logits(model, data, data.test).argmax(-1)
                                              == data.labels[data.test]).float().mean()))
    # the bisection's answer is the smallest sufficient k of a full sweep
    ev = mod.hook_evaluator(model, "blocks.0.hook_resid_post", data.tokens[data.test], mod.answer_accuracy(7), pos=-1)
    full = mod.core_dims(ev, r.ace, r.ace_dims.ks, r.test_acc, 1 / 7, 0.95 * r.test_acc, 2 / 7, thresholds="raw",
                         higher_is_better=True)
    k = r.ace_dims.k_sufficient                        # a sufficient k, or None when the largest k is not
    assert (k is None) == (full.keep[-1] < 0.95 * r.test_acc)
    assert k is None or full.keep[full.ks.index(k)] >= 0.95 * r.test_acc
    rows = track_cores(model, snaps, data, progress=False)
    assert [row.step for row in rows] == [0, 20, 40]
    for row in rows:
        assert len(row.eigvals[0]) == row.rot_k[0] and row.rotations[0]["unit_dev"] >= 0
        assert row.n_active == len(row.key_freqs) >= 1


def test_grokking_sweep_marks_censored_runs():
    rows = grokking_sweep([1.0], [5, 7], max_steps=20, log_every=10, model_kw=TINY, progress=False)
    assert [(r["omega"], r["p"]) for r in rows] == [(1.0, 5), (1.0, 7)]
    for r in rows:
        assert r["censored"] == (r["tau_grok"] is None)
        assert r["tau"] == (20 if r["censored"] else r["tau_grok"])
