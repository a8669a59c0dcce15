"""Tests for coreinv.tasks.grokking (data, fourier, training, cores, scaling) beyond the notebooks' own checks
(nbs/22_grokking_*.ipynb, run by nbval): more bad inputs, exact Fourier powers, censoring in the scaling fit, rotations of scaled codes,
resuming a killed run, and core_at's bisection against a full sweep."""
import math

import numpy as np
import pytest
import torch

import coreinv.tasks.grokking.cores as cores
import coreinv.tasks.grokking.training as training
from coreinv.identify import operator_spectrum
from coreinv.tasks.grokking.cores import core_at, operator_k, track_cores
from coreinv.tasks.grokking.data import answer_forward, modular_data
from coreinv.tasks.grokking.fourier import (active_frequencies, code_frequencies, frequency_power, rotation_summary,
                                            shift_operator)
from coreinv.tasks.grokking.scaling import fit_scaling_law, grokking_sweep, predict_tau
from coreinv.tasks.grokking.training import (log_columns, make_modular_model, stable_steps, stays_grokked,
                                             train_modular)

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
    assert active_frequencies(power) == [4]             # shares 0.80 and 0.20 against 2 × 1/8 = 0.25
    assert active_frequencies(power, times_uniform=1.5) == [4, 7]
    assert power[3] == pytest.approx(1 / 1.245) and power[6] == pytest.approx(0.245 / 1.245)   # cos+sin vs 0.7² cos
    # the constant column contributes nothing; a column rotation changes nothing
    Q = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(0)))[0]
    assert np.allclose(frequency_power(W @ Q), power)
    with pytest.raises(ValueError):
        frequency_power(torch.randn(17))
    with pytest.raises(ValueError):
        active_frequencies(power, times_uniform=1.0)


@pytest.mark.parametrize("p,d", [(31, 32), (59, 128), (59, 64), (113, 128)])
def test_random_embedding_has_no_active_frequency(p, d):
    "The negative control of the active-frequency threshold: a random embedding fails it (every seed tried)."
    for seed in range(5):
        W = torch.randn(p, d, generator=torch.Generator().manual_seed(seed)) / math.sqrt(d)
        assert active_frequencies(frequency_power(W)) == []
        # ... and the old "≥ 10% of the top" rule would have called every frequency active
        power = frequency_power(W)
        assert (power >= 0.1 * power.max()).sum() == p // 2


def test_code_frequencies_finds_the_frequencies_of_a_code():
    p = 23
    a, b = torch.arange(p).repeat_interleave(p).double(), torch.arange(p).repeat(p).double()
    Z = torch.stack([torch.cos(2 * math.pi * 4 * (a + b) / p), torch.sin(2 * math.pi * 4 * (a + b) / p),
                     torch.cos(2 * math.pi * 9 * a / p), torch.sin(2 * math.pi * 9 * a / p)], 1)
    assert sorted(code_frequencies(Z, p)) == [4, 9]
    assert code_frequencies(torch.randn(p * p, 6, generator=torch.Generator().manual_seed(0)).double(), p) == []
    assert operator_k(2, 7, 22) == 4 and operator_k(0, 7, 22) == 7 and operator_k(0, None, 22) == 22
    assert operator_k(20, 3, 22) == 22
    with pytest.raises(ValueError):
        code_frequencies(Z[:-1], p)


@pytest.mark.parametrize("norm,n_layers", [("LN", 2), (None, 2), ("LN", 1)])
def test_answer_forward_equals_the_hooked_transformer_at_equals(norm, n_layers):
    "The fast forward used for training is the HookedTransformer's own forward at the `=` position."
    data = modular_data(11, 0.5, seed=0)
    model = make_modular_model(11, n_layers=n_layers, d_model=32, n_heads=4, d_mlp=64, seed=3,
                               normalization_type=norm)
    with torch.no_grad():                                          # random, non-trivial LN weights and biases
        for name, w in model.named_parameters():
            if "ln" in name or name.endswith("b_Q") or name.endswith("b_K"): w.add_(0.3 * torch.randn_like(w))
        ref = model(data.tokens)[:, -1]                            # [p*p, d_vocab_out]
        fast = answer_forward(model, data.tokens)
    assert fast.shape == ref.shape and torch.allclose(fast, ref, atol=1e-5)


def test_answer_forward_refuses_a_model_it_does_not_write_out():
    from coreinv.train import make_transformer
    with pytest.raises(ValueError, match="normalization_type"):
        answer_forward(make_transformer(1, 16, 2, 8, 3, 32, normalization_type="RMS"), torch.zeros(2, 3, dtype=torch.long))


def test_stays_grokked_and_stable_steps():
    log = {"step": [0, 10, 20, 30, 40, 50], "test_acc": [0.0, 0.96, 0.97, 0.2, 0.98, 0.99]}
    assert stays_grokked(log, 10) == {"share_above": 0.75, "min_test_acc": 0.2, "final_test_acc": 0.99, "window": 0}
    assert stays_grokked(log, 10, window=20)["min_test_acc"] == 0.98          # the dip at 30 is inside the window
    with pytest.raises(ValueError, match="window"):
        stays_grokked(log, 10, window=-1)
    assert stays_grokked(log, None)["share_above"] is None
    assert stable_steps(log, 10).tolist() == [False, False, False, False, False, True]
    assert stable_steps(log, 0).tolist() == [False, True, True, False, True, True]
    with pytest.raises(ValueError):
        stable_steps(log, -1)


def test_rotation_summary_paper_form_both_directions():
    p = 17
    ev = np.exp(1j * 2 * np.pi * np.array([3, -3, 5, -5]) / p)
    r = rotation_summary(ev, p, [3, 5])
    assert r["coverage_err"] < 1e-12 and r["rotation_err"] < 1e-12
    r = rotation_summary(ev, p, [3])                     # the plane at 5 is not a key frequency
    assert r["coverage_err"] < 1e-12 and r["rotation_err"] == pytest.approx(2 * np.pi * 2 / p)
    r = rotation_summary(ev, p, [3, 5, 7])               # key frequency 7 has no rotation
    assert r["coverage_err"] == pytest.approx(2 * np.pi * 2 / p) and r["rotation_err"] < 1e-12


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
    tobit = fit_scaling_law(om, pp, np.minimum(tau, 600), cens, how="tobit", n_boot=30)
    assert tobit["n_runs"] == tau.size and abs(tobit["alpha"] - 1) < abs(budgeted["alpha"] - 1)
    noisy_c = np.minimum(noisy, 600)
    t2 = fit_scaling_law(om, pp, noisy_c, noisy > 600, how="tobit", n_boot=30)
    assert abs(t2["alpha"] - 1) < 0.4
    with pytest.raises(ValueError):
        fit_scaling_law(om, pp, np.minimum(tau, 1), tau > 1, how="tobit")   # nothing grokked
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
    real = training.evaluate
    calls = {"n": 0}

    def dying(model, data):
        calls["n"] += 1
        if calls["n"] == 4:                                   # step 30: after the step-20 checkpoint
            raise KeyboardInterrupt
        return real(model, data)

    monkeypatch.setattr(training, "evaluate", dying)
    with pytest.raises(KeyboardInterrupt):
        _train_tiny(snapshot_every=10, checkpoint_dir=tmp_path, checkpoint_every=20)
    monkeypatch.setattr(training, "evaluate", real)
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
    ev = cores.hook_evaluator(model, "blocks.0.hook_resid_post", data.tokens[data.test], cores.answer_accuracy(7), pos=-1)
    level = 1 / 7 + 0.95 * (r.test_acc - 1 / 7)          # sufficiency keeps 95% of the margin over chance
    full = cores.core_dims(ev, r.ace, r.ace_dims.ks, r.test_acc, 1 / 7, level, 2 / 7, thresholds="raw",
                         higher_is_better=True)
    k = r.ace_dims.k_sufficient                        # a sufficient k, or None when the largest k is not
    assert (k is None) == (full.keep[-1] < level)
    assert k is None or full.keep[full.ks.index(k)] >= level
    rows = track_cores(model, {40: snaps[40]}, data, split="test", progress=False)   # the same numbers at the last snapshot
    assert rows[0].cores[0].ace_dims == r.ace_dims and rows[0].cores[0].test_acc == r.test_acc


def test_necessity_against_the_floor_on_a_planted_evaluator(monkeypatch):
    """Necessity is judged against the floor (the whole `=` activation removed), not against chance.

    A planted evaluator: the answer is carried on 3 directions, so removing k of them leaves
    intact − (intact − floor) · min(k, 3)/3, and replacing the activation by its mean (k = 0 kept) leaves the
    floor. With the floor at 0.5, far above 2/p = 0.29 (layer 1 re-reads a and b), the old absolute rule
    never finds a necessary k (censored); the floor rule finds the planted 3. The twin: a bypassed position
    (removing everything leaves 0.95) has no measurable necessity, and core_at says so instead of calling
    k = 1 necessary."""
    model, data, _, _ = _train_tiny(steps=1)
    hook = "blocks.0.hook_resid_post"

    def planted(floor, intact=1.0):
        def make(model, hook, inputs, metric, pos=None):
            def evaluate(core, mode="keep"):
                if core is None: return intact
                if mode == "keep": return floor if core.k == 0 else intact
                return intact - (intact - floor) * min(core.k, 3) / 3
            return evaluate
        return make

    monkeypatch.setattr(cores, "hook_evaluator", planted(0.5))
    new = core_at(model, data, hook, split="train")
    assert new.floor == 0.5 and new.ace_dims.k_necessary == 3 and new.pca_dims.k_necessary == 3
    old = core_at(model, data, hook, split="train", level_nec=2 / data.p)
    assert old.ace_dims.k_necessary is None and old.ace_dims.bounded("k_necessary")[1]     # censored
    monkeypatch.setattr(cores, "hook_evaluator", planted(0.95))
    bypassed = core_at(model, data, hook, split="train")
    assert bypassed.level_nec is None and bypassed.ace_dims.k_necessary is None
    assert bypassed.summary()["level_nec"] is None


def test_paper_preset_dry_run():
    """The chapter's steps at the `paper` preset's sizes, on CPU: one training step of the main model, one
    core analysis (ACE on all p² pairs, a few k) with its shift operator, one sweep run of one step, and the
    censored scaling fit. A shape error shows here, not after an hour on a GPU."""
    from coreinv.tasks.grokking.necessity import core_at_every_position
    from coreinv.tasks.grokking.presets import SIZES
    S = SIZES.at("paper")
    data = modular_data(S.p, S.train_frac, seed=0)
    model = make_modular_model(S.p, S.n_layers, S.d_model, S.n_heads, S.d_mlp, seed=0)
    log, snaps = train_modular(model, data, 1, lr=S.lr, weight_decay=S.weight_decay, schedule="onecycle",
                               pct_start=S.pct_start, log_every=1, snapshot_every=1, progress=False)
    assert list(snaps) == [0, 1] and np.isfinite(log_columns(log)["train_loss"]).all()
    r = core_at_every_position(model, data, f"blocks.{S.n_layers - 1}.hook_resid_post", k_max=3, split="train")
    assert r.ace_dims.ks == [1, 2, 3] and r.acts.shape == (S.p * S.p, S.d_model) and r.every.dims.ks == [1, 2, 3]
    Z = r.ace.transform(r.acts, 4)                                       # [p*p, 4]
    ev = operator_spectrum(shift_operator(Z, S.p))
    assert len(ev) == 4 and np.isfinite(rotation_summary(ev, S.p, [1, 2])["unit_dev"])
    rows = grokking_sweep(S.sweep_omegas[:1], S.sweep_ps[:1], S.sweep_seeds[:1], max_steps=1,
                              train_frac=S.train_frac, lr=S.lr, log_every=1, progress=False,
                              model_kw=dict(n_layers=S.n_layers, d_model=S.sweep_d_model, n_heads=S.n_heads,
                                            d_mlp=S.sweep_d_mlp))
    assert rows[0]["censored"] and not rows[0]["no_fit_first"]
    n_fix = round(S.train_frac * min(S.sweep_ps) ** 2)                 # the confound cell: the smallest p's pairs
    assert len(modular_data(S.sweep_confound_p, n_fix / S.sweep_confound_p ** 2).train) == n_fix
    om, pp = np.meshgrid(S.sweep_omegas, S.sweep_ps)
    tau = 3e4 / (om * pp)
    fit = fit_scaling_law(om, pp, np.minimum(tau, S.sweep_max_steps), tau > S.sweep_max_steps, how="tobit", n_boot=10)
    assert np.isfinite([fit["alpha"], fit["beta"]]).all()


def test_a_kept_sweep_is_read_back_and_trains_nothing(tmp_path, monkeypatch):
    """With a `checkpoint_dir`, `grokking_sweep` keeps each run's row: a second sweep returns the same rows
    without training (map_processes is not called), a grokked row survives the JSON round trip with its
    types, and another setting (here the step budget) is a run of its own."""
    from coreinv.tasks.grokking import scaling
    kw = dict(train_frac=0.5, log_every=5, lr=1e-2, model_kw=dict(n_layers=1, d_model=32, n_heads=2, d_mlp=64),
              processes=1, progress=False, checkpoint_dir=tmp_path)
    first = scaling.grokking_sweep([1.0], [5], seeds=(0, 1), max_steps=200, **kw)
    assert len(list(tmp_path.glob("*.json"))) == 2 and not list(tmp_path.glob("*.tmp"))
    def no_training(*a, **k):
        raise AssertionError("a kept run was trained again")
    monkeypatch.setattr(scaling, "map_processes", no_training)
    again = scaling.grokking_sweep([1.0], [5], seeds=(0, 1), max_steps=200, **kw)
    assert again == first and [type(v) for v in again[0].values()] == [type(v) for v in first[0].values()]
    with pytest.raises(AssertionError, match="trained again"):
        scaling.grokking_sweep([1.0], [5], seeds=(0,), max_steps=100, **kw)


@pytest.mark.parametrize("preset", ["ci", "book", "paper"])
def test_analysis_spacings_hit_snapshots(preset):
    """The chapter analyses every `dense_every`-th step (the snap's window), picking them from the snapshots by
    `step % spacing == 0`, and judges each snapshot on its own logged test accuracy (a grokked snapshot): a
    spacing that is not a multiple of `snapshot_every`, or snapshots between logged steps, would leave a window
    empty or a snapshot unjudged without a word."""
    from coreinv.tasks.grokking.presets import SIZES
    S = SIZES.at(preset)
    assert S.dense_every >= S.snapshot_every and S.dense_every % S.snapshot_every == 0, (preset, S.dense_every)
    assert S.snapshot_every % S.log_every == 0, (preset, S.snapshot_every, S.log_every)
    assert "late_every" not in S
