"""Unit tests for coreinv.train beyond the notebook's own checks: initialisation scale, refusals, the log's
step grid, the global RNG, finished runs, the checkpoint cache's key, the steps the callback sees and
where it stops, and threads.
The weight-space maps (coreinv.merge) are tested in nbs/14_merge.ipynb."""
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coreinv.train import CHECKPOINT_NAME, checkpoint_key, make_transformer, train


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
    again, drawn = small(), []
    train(again, lambda g: drawn.append(1) or copy_batch(g), copy_loss, checkpoint_dir=tmp_path, **KW)
    assert same(m, again) and len(drawn) == 1, "only the batch that keys the cache is drawn"


# -- the checkpoint cache is keyed on the whole run (issue 12, "Stale checkpoints") ----------------------
HP = dict(steps=30, lr=1e-2, betas=[0.9, 0.98], weight_decay=0.1, schedule="onecycle", pct_start=0.3,
          grad_clip=None, seed=0)


def _split(frac):
    "A full-batch task whose train split is the first `frac` of a fixed data set (as train_frac does)."
    data = torch.randint(0, 4, (100, 8), generator=torch.Generator().manual_seed(0))
    return lambda g: data[: int(frac * len(data))]


def test_checkpoint_key_changes_with_everything_that_decides_the_weights(monkeypatch):
    import coreinv.train
    base = checkpoint_key(small(), copy_batch, HP)
    assert checkpoint_key(small(), copy_batch, dict(HP)) == base, "the same run, the same key"
    assert checkpoint_key(small(), _split(0.3), HP) != checkpoint_key(small(), _split(0.5), HP), "train_frac"
    assert checkpoint_key(make_transformer(2, 16, 2, 4, 8, seed=0), copy_batch, HP) != base, "n_layers"
    assert checkpoint_key(make_transformer(1, 16, 2, 4, 8, seed=0, act_fn="gelu"), copy_batch, HP) != base
    assert checkpoint_key(small(seed=1), copy_batch, HP) != base, "the initialisation seed"
    assert checkpoint_key(small(), copy_batch, HP | dict(seed=1)) != base, "the batches' seed"
    assert checkpoint_key(small(), copy_batch, HP | dict(lr=2e-2)) != base
    assert checkpoint_key(small(), copy_batch, HP, dict(p=31)) != checkpoint_key(small(), copy_batch, HP, dict(p=37))
    assert checkpoint_key(small(), copy_batch, HP, code=[copy_loss]) != base, "the loss's code"
    monkeypatch.setattr(coreinv.train, "function_key", lambda *fns: "0123456789ab")
    assert checkpoint_key(small(), copy_batch, HP) != base, "the training code"


def test_a_stale_checkpoint_is_never_reused(tmp_path, monkeypatch):
    import coreinv.train
    first = small()
    train(first, _split(0.3), copy_loss, checkpoint_dir=tmp_path, **KW)
    other = small()                                   # another train_frac: trained afresh, not loaded
    train(other, _split(0.5), copy_loss, checkpoint_dir=tmp_path, **KW)
    fresh = small()
    train(fresh, _split(0.5), copy_loss, **KW)
    assert same(other, fresh) and not same(other, first)
    # new training code: the old checkpoints are not loaded
    monkeypatch.setattr(coreinv.train, "function_key", lambda *fns: "0123456789ab")
    drawn = []
    train(small(), lambda g: drawn.append(1) or _split(0.3)(g), copy_loss, checkpoint_dir=tmp_path, **KW)
    assert len(drawn) == 1 + KW["steps"], "new training code trains again"
    assert len(list(tmp_path.glob(f"*/{CHECKPOINT_NAME}"))) == 3


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


def test_a_save_writes_a_temporary_of_its_own_and_a_failed_one_keeps_the_old_file(tmp_path, monkeypatch):
    """`_save_atomic`: each call writes its own temporary beside the file, then renames it (the control: one
    shared `<name>.tmp`, which two processes saving one checkpoint at once would both write into); a save
    that fails part-way leaves the old file as it was and no temporary behind."""
    import os
    import coreinv.train as tr
    path = tmp_path / "a.pt"
    temps, replace = [], os.replace
    monkeypatch.setattr(tr.os, "replace", lambda src, dst: (temps.append(Path(src)), replace(src, dst))[1])
    tr._save_atomic({"x": 1}, path)
    tr._save_atomic({"x": 2}, path)
    assert len(set(temps)) == 2 and all(t.parent == tmp_path and t.name.startswith("a.pt.") for t in temps)
    with pytest.raises(Exception):
        tr._save_atomic({"f": lambda: 0}, path)                     # a lambda cannot be pickled
    assert torch.load(path) == {"x": 2} and [p.name for p in tmp_path.iterdir()] == ["a.pt"]


def test_warmup_schedule_rises_then_holds():
    """`schedule="warmup"` (issue 42): one-cycle's warm-up from lr/25 to lr over pct_start of the steps, then lr held
    to the end, so that weight-decay time ∫ lr·ω dt keeps growing; one-cycle's lr ends near 0."""
    log = train(small(), copy_batch, copy_loss, **(KW | dict(steps=40, log_every=1, schedule="warmup",
                                                             pct_start=0.25)))
    lr = np.asarray(log["lr"])                              # the lr of the next update, at each logged step
    assert np.isclose(lr[0], 1e-2 / 25) and np.all(np.diff(lr[:10]) > 0)
    assert np.allclose(lr[9:], 1e-2)
    one = np.asarray(train(small(), copy_batch, copy_loss, **(KW | dict(steps=40, log_every=1, pct_start=0.25)))["lr"])
    assert np.allclose(one[:10], lr[:10]) and one[-1] < 1e-4           # the same warm-up; one-cycle then decays
    with pytest.raises(ValueError, match="'warmup'"):
        train(small(), copy_batch, copy_loss, **(KW | dict(schedule="cosine")))
