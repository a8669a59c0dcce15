"""`coreinv.train.map_processes`: a worker process that dies is reported with its likely causes; workers see the
caller's environment and code as they are at the call."""
import json
import os

import pytest

from coreinv.train import map_processes


def _refuse_unpickling():
    raise RuntimeError("this object cannot be rebuilt in another process")


class Unpicklable:
    "Pickles fine here; unpickling it in a worker raises, which kills the worker before the call."
    def __reduce__(self):
        return _refuse_unpickling, ()


def test_dead_worker_is_reported_with_what_to_try():
    with pytest.raises(RuntimeError, match="worker process of map_processes.*died.*processes=1"):
        map_processes(dict, [dict(x=Unpicklable()), dict(x=1)], processes=2, progress=False)


def test_errors_of_a_call_reach_the_caller():
    with pytest.raises(json.JSONDecodeError):
        map_processes(json.loads, [dict(s="1"), dict(s="one")], processes=2, progress=False)


def test_off_the_cpu_the_calls_run_here():
    # one accelerator is not shared between processes: a lambda (which no worker could import) runs here
    assert map_processes(lambda x: x + 1, [dict(x=1), dict(x=2)], processes=2, progress=False,
                         device="cuda") == [2, 3]


def test_workers_take_the_environment_as_it_is_at_the_call(monkeypatch):
    # the fork server starts with the first call; a variable set after it must still reach the next call's workers
    monkeypatch.delenv("COREINV_PROBE", raising=False)
    assert map_processes(os.getenv, [dict(key="COREINV_PROBE")] * 2, processes=2, progress=False) == [None, None]
    monkeypatch.setenv("COREINV_PROBE", "set after the server started")
    assert map_processes(os.getenv, [dict(key="COREINV_PROBE")] * 2, processes=2,
                         progress=False) == ["set after the server started"] * 2


def test_workers_read_an_edited_module_afresh(tmp_path, monkeypatch):
    # the fork server holds installed packages only: a module of the user's (or coreinv's) is read from disk
    # by each call's workers, so an edit between two calls reaches the second
    mod = tmp_path / "edited_between_calls.py"
    mod.write_text("def answer():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import edited_between_calls
    assert map_processes(edited_between_calls.answer, [{}, {}], processes=2, progress=False) == [1, 1]
    mod.write_text("def answer():\n    return 'edited'\n")                 # another size: no stale bytecode
    assert map_processes(edited_between_calls.answer, [{}, {}], processes=2, progress=False) == ["edited"] * 2


def test_results_with_many_tensors_come_back():
    """A run's snapshots are thousands of tensors; sent as shared-memory file descriptors they broke the pipe
    ("received 0 items of ancdata") past the open-file limit. Results travel by value: with the limit lowered below
    the number of tensors, two tiny runs' 41 snapshots each (≈ 1,000 tensors a run) still come back, equal to a
    run in this process."""
    import resource
    import torch
    from coreinv.tasks.grokking.training import grokking_run
    job = dict(p=5, train_frac=0.5, steps=40, model_kw=dict(n_layers=1, d_model=8, n_heads=2, d_mlp=16),
               snapshot_every=1, log_every=20)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(512, hard), hard))
    try:
        runs = map_processes(grokking_run, [job | dict(seed=0), job | dict(seed=1)], processes=2, progress=False)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    n = sum(t.numel() > 0 for s in runs[0]["snapshots"].values() for t in s.values())
    assert len(runs[0]["snapshots"]) == 41 and n > 512
    here = grokking_run(**job, seed=1)
    assert all(torch.equal(a, here["snapshots"][40][k]) for k, a in runs[1]["snapshots"][40].items())
