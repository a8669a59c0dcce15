"""Data-parallel fits under torch.distributed (gloo, CPU): every rank ends with the single-process fit.

Each test starts 2 or 3 local processes. Every rank builds the same data from a seed and fits on its
own shard; the parent fits once on all of it and compares (float64, to 1e-10). Shards are uneven,
and one rank of three holds nothing. A rank that fails stops the others with a clear error.
"""
import os
import pickle
import time
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from coreinv.ace import ACE
from coreinv.dictionaries import RandomFourierDictionary
from coreinv.koopman import EDMDc, linear_control_system

F64 = torch.float64
N, D, O = 600, 6, 3


def _data():
    g = torch.Generator().manual_seed(0)
    acts = torch.randn(N, D, generator=g, dtype=F64) @ torch.randn(D, D, generator=g, dtype=F64) + 1.5
    W = torch.randn(O, D, generator=g, dtype=F64)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    torch.manual_seed(0)
    for p in mlp.parameters(): nn.init.normal_(p, std=0.5)
    xs = torch.randn(90, 4, generator=g, dtype=F64)
    _, _, X, U, Y = linear_control_system(800, noise=0.1, seed=3)
    return acts, (lambda x: torch.tanh(x / 3) @ W.T), mlp, xs, (X, U, Y)


def _bounds(n, size):
    "Shard boundaries: uneven, and with 3 ranks the first holds nothing."
    cuts = {2: [0, n // 3, n], 3: [0, 0, n // 4, n]}[size]
    return list(zip(cuts[:-1], cuts[1:]))


def _fits(shard):
    "The fits every test compares, each on the rows `shard` selects (a slice, or all)."
    acts, f, mlp, xs, (X, U, Y) = _data()
    s, t, m = shard(N), shard(len(xs)), shard(len(X))
    rff = RandomFourierDictionary(20, bandwidth=2.0, seed=1)
    jvp = ACE(batch_size=64).fit(acts[s], f)
    gram = ACE("gramian", batch_size=64).fit(acts[s], f)
    hook = ACE(batch_size=8, float64=True).fit_hook(mlp, [xs[t][i:i + 8] for i in range(0, len(xs[t]), 8)], "1",
                                       lambda out, x: out)
    edmd = EDMDc(rff).fit(X[m], U[m], Y[m])
    stream, (Xm, Um, Ym) = EDMDc(rff), (X[m], U[m], Y[m])
    for i in range(0, max(len(Xm), 1), 100):              # a rank without data passes one empty batch
        stream.partial_fit(Xm[i:i + 100], Um[i:i + 100], Ym[i:i + 100])
    stream.finalize()
    out = {k: (a.singular_values_.numpy(), a.basis_.numpy(), a.n_samples_)
           for k, a in [("jvp", jvp), ("gramian", gram), ("fit_hook", hook)]}
    out.update({k: (e.A_, e.B_, e.C_, e.eigvals_, e.n_samples_seen_) for k, e in [("edmdc", edmd), ("stream", stream)]})
    return out


def _scenario_fits(rank, size):
    lo, hi = _bounds(12, size)[rank]                    # twelfths of each data set
    return _fits(lambda n: slice(n * lo // 12, n * hi // 12))


def _scenario_failures(rank, size):
    acts, f, mlp, xs, (X, U, Y) = _data()
    half = slice(0, N // 2) if rank == 0 else slice(N // 2, N)
    out = {}
    bad = acts[half].clone()
    if rank == 1: bad[3, 2] = float("nan")               # a bad shard, caught by the input check
    try: ACE().fit(bad, f); out["input"] = "no error"
    except Exception as e: out["input"] = f"{type(e).__name__}: {e}"
    g = (lambda x: f(x).log()) if rank == 1 else f        # fails mid-way, in the JVPs of rank 1 only
    try: ACE().fit(acts[half], g); out["midway"] = "no error"
    except Exception as e: out["midway"] = f"{type(e).__name__}: {e}"
    return out


def _scenario_dies(rank, size):
    _, _, _, _, (X, U, Y) = _data()
    if rank == 1: return "exit"                          # leaves without a word
    t = time.perf_counter()
    try: EDMDc().fit(X[:400], U[:400], Y[:400]); msg = "no error"
    except Exception as e: msg = f"{type(e).__name__}: {e}"
    return {"dies": msg, "seconds": time.perf_counter() - t}


SCENARIOS = {"fits": _scenario_fits, "failures": _scenario_failures, "dies": _scenario_dies}


def _worker(rank, size, init_file, out_dir, scenarios):
    "One rank: run the scenarios in order ('dies' last), then write what each returned."
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=15))
    res = {}
    for name in scenarios:
        try:
            res[name] = SCENARIOS[name](rank, size)
        except BaseException as e:
            res[name] = {"crash": f"{type(e).__name__}: {e}"}
    with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as fh:
        pickle.dump(res, fh)
    if "dies" in scenarios: os._exit(0)                 # the peer is gone: no clean shutdown
    dist.destroy_process_group()


# The ranks fork from a fork server that has imported PyTorch once, as coreinv's own workers do
# (`coreinv.runtime.worker_context`: installed packages only); spawned, each would import it again.
START = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    "Spawn once per world size: 2 ranks (fits, failures, a rank that dies) and 3 ranks (fits)."
    if START == "forkserver":
        mp.set_forkserver_preload(["torch"])                # read when the server starts (if it has not)
    out = {}
    for size, scenarios in [(2, ("fits", "failures", "dies")), (3, ("fits",))]:
        tmp = tmp_path_factory.mktemp(f"ranks{size}")
        ctx = mp.start_processes(_worker, args=(size, str(tmp / "init"), str(tmp), scenarios),
                                 nprocs=size, join=False, start_method=START)
        deadline = time.time() + 50
        while not ctx.join(timeout=1):
            if time.time() > deadline:
                for p in ctx.processes: p.kill()
                pytest.fail(f"{size} processes hung for 50 s")
        out[size] = [pickle.load(open(tmp / f"{r}.pkl", "rb")) for r in range(size)]
    return out


@pytest.mark.parametrize("size", [2, 3])
def test_every_rank_holds_the_single_process_fit(size, runs):
    whole = _fits(lambda n: slice(0, n))
    for r, res in enumerate(rank["fits"] for rank in runs[size]):
        assert "crash" not in res, res
        for k in ("jvp", "gramian", "fit_hook"):
            S, U, n = res[k]
            assert n == whole[k][2]
            np.testing.assert_allclose(S, whole[k][0], rtol=1e-10, err_msg=f"rank {r} {k}")
            np.testing.assert_allclose(U, whole[k][1], atol=1e-10, err_msg=f"rank {r} {k}")
        for k in ("edmdc", "stream"):
            for got, want in zip(res[k], whole[k]):
                np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=f"rank {r} {k}")


def test_a_failing_rank_stops_the_others(runs):
    ranks = [r["failures"] for r in runs[2]]
    assert ranks[1]["input"].startswith("ValueError") and "NaN" in ranks[1]["input"]
    assert ranks[0]["input"].startswith("RuntimeError") and "rank 1 of 2 failed" in ranks[0]["input"]
    assert ranks[1]["midway"].startswith("ValueError")
    assert "rank 1 of 2 failed" in ranks[0]["midway"]


def test_a_rank_that_dies_does_not_hang_the_others(runs):
    ranks = [r["dies"] for r in runs[2]]
    assert ranks[1] == "exit"
    assert ranks[0]["dies"].startswith("RuntimeError") and "collective" in ranks[0]["dies"]
    assert ranks[0]["seconds"] < 30
