"""Tests for coreinv.tasks.grokking.necessity: necessity with the ablation at every position, beside the `=`
position alone, each against its own floor, on a planted model whose answer later positions re-read."""
import pickle

import numpy as np

import pytest
import torch

from coreinv.base import Core
from coreinv.tasks.grokking.necessity import (LayerCoreEvery, core_at_every_position, necessity_at,
                                              planted_copies, position_evaluator, position_means)
from coreinv.tasks.grokking.cores import track_cores
from coreinv.tasks.grokking.data import answer_accuracy, modular_data
from coreinv.tasks.grokking.training import make_modular_model, train_modular


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _axes(d):
    "The planted answer's axes first: the core of k is the first k axes (through 0; each position's mean is put in)."
    return lambda k: Core(torch.eye(d, dtype=torch.float64)[:, :k], torch.zeros(d))


@pytest.mark.parametrize("n_copies", [2, 3])
def test_every_position_finds_the_planted_k_where_the_equals_position_is_bypassed(n_copies):
    """Planted: the answer sits on `n_copies` axes at every position, and the readout re-reads it from the `a`
    and `b` positions when the `=` copies are gone. The old ruler (removal at `=` only) is bypassed: its floor
    (the whole `=` activation removed) keeps accuracy 1.0, so necessity is not measurable there. The new
    ruler (removal at every position, its floor the input-blind 1/p) finds the planted k = n_copies, and no
    smaller k. The twin (copies at `=` only, nothing to re-read) gives the planted k under both rulers."""
    p = 8
    model, tok = planted_copies(p, n_copies, reread=True)
    metric, axes, ks = answer_accuracy(p), _axes(n_copies + 2), range(1, n_copies + 3)
    old = necessity_at(model, "resid", tok, tok, metric, axes, ks, 1 / p, positions=-1)
    new = necessity_at(model, "resid", tok, tok, metric, axes, ks, 1 / p, positions="all")
    assert old.intact == new.intact == 1.0
    assert old.floor == 1.0 and not old.measurable and old.dims.k_necessary is None
    assert old.dims.bounded("k_necessary")[1]                                      # censored, flagged
    assert new.floor == pytest.approx(1 / p) and new.measurable and new.dims.k_necessary == n_copies
    evaluate = position_evaluator(model, "resid", tok, metric, position_means(model, "resid", tok), "all")
    assert evaluate(axes(n_copies - 1), "remove") == 1.0                           # one copy left is enough
    twin, tok = planted_copies(p, n_copies, reread=False)
    for where in (-1, "all"):
        r = necessity_at(twin, "resid", tok, tok, metric, axes, ks, 1 / p, positions=where)
        assert r.measurable and r.dims.k_necessary == n_copies and r.floor == pytest.approx(1 / p)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="even"):
        planted_copies(7)
    with pytest.raises(ValueError, match="n_copies"):
        planted_copies(8, 0)
    model, tok = planted_copies(8, 2)
    means = position_means(model, "resid", tok)
    for bad in (3, -4, "every", 1.0):
        with pytest.raises(ValueError, match="positions"):
            position_evaluator(model, "resid", tok, answer_accuracy(8), means, bad)
    with pytest.raises(ValueError, match="nec_share"):
        necessity_at(model, "resid", tok, tok, answer_accuracy(8), _axes(4), range(1, 3), 1 / 8, nec_share=0)


def test_track_cores_carries_the_every_position_numbers():
    """`track_cores(core_fn=core_at_every_position)`: every layer's core holds both rulers' numbers, its
    summary has them, the `=`-only numbers equal `core_at`'s, and the row pickles (worker processes)."""
    data = modular_data(7, 0.6, seed=0)
    model = make_modular_model(7, seed=0, n_layers=1, d_model=16, n_heads=2, d_mlp=32)
    _, snaps = train_modular(model, data, 20, lr=1e-2, log_every=10, snapshot_every=20, progress=False)
    plain = track_cores(model, {20: snaps[20]}, data, processes=1, progress=False, k_sweep=4)
    rows = track_cores(model, {20: snaps[20]}, data, processes=1, progress=False, k_sweep=4,
                       core_fn=core_at_every_position)
    c, c0 = rows[0].cores[0], plain[0].cores[0]
    assert isinstance(c, LayerCoreEvery) and c.ace is None and c.acts is None
    assert (c.ace_dims.k_necessary, c.floor, c.level_nec) == (c0.ace_dims.k_necessary, c0.floor, c0.level_nec)
    s = rows[0].summary()["layers"][0]
    assert {"every_floor", "every_level_nec", "ace_nec_every", "ace_suff_every"} <= set(s)
    assert s["every_floor"] == c.every.floor
    assert pickle.loads(pickle.dumps(rows[0])).cores[0].every.floor == c.every.floor


def test_a_scheduled_sweep_run_stopped_at_grokking_is_a_prefix_of_the_full_run(monkeypatch):
    """The sweep trains with the main runs' one-cycle schedule over `max_steps` and stops a run once it groks:
    the stopped run's loss and lr are the first part of the unstopped run's (the schedule does not depend on
    the stop). A planted grokking: the evaluation reports test accuracy 1 from its fifth call (step 20) on.
    `grokking_sweep` takes the schedule and refuses another stop_at."""
    import coreinv.tasks.grokking.training as mod
    from coreinv.tasks.grokking.scaling import grokking_sweep
    from coreinv.tasks.grokking.training import log_columns
    kw = dict(lr=1e-2, schedule="onecycle", pct_start=0.1, log_every=5, progress=False, seed=0)
    data = modular_data(7, 0.6, seed=0)
    tiny = lambda: make_modular_model(7, seed=0, n_layers=1, d_model=16, n_heads=2, d_mlp=32)
    full = log_columns(train_modular(tiny(), data, 40, **kw)[0])
    real, calls = mod.evaluate, {"n": 0}

    def groks_at_20(model, data):
        calls["n"] += 1
        return real(model, data) | ({"test_acc": 1.0} if calls["n"] >= 5 else {})
    monkeypatch.setattr(mod, "evaluate", groks_at_20)
    cut = log_columns(train_modular(tiny(), data, 40, stop_at=0.95, **kw)[0])
    assert cut["step"][-1] == 20 and full["step"][-1] == 40
    for k in ("loss", "lr"):
        assert np.array_equal(cut[k], full[k][: len(cut[k])], equal_nan=True), k
    monkeypatch.setattr(mod, "evaluate", real)
    rows = grokking_sweep([1.0], [7], max_steps=40, log_every=5, schedule="onecycle", pct_start=0.1,
                          model_kw=dict(n_layers=1, d_model=16, n_heads=2, d_mlp=32), processes=1, progress=False)
    assert rows[0]["steps_run"] <= 40
    with pytest.raises(ValueError, match="stop_at"):
        grokking_sweep([1.0], [7], max_steps=10, stop_at=0.5, processes=1, progress=False)
