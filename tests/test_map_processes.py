"""`coreinv.train.map_processes`: a worker process that dies is reported with its likely causes."""
import json

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
