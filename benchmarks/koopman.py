"""Benchmark: coreinv.koopman.EDMDc against PyDMD's DMDc, and streaming memory.

Run:  .venv/bin/python benchmarks/koopman.py            (about 2-3 minutes on 2 shared cores)
      .venv/bin/python benchmarks/koopman.py --quick    (M = 10^4 only, and a 10^5 stream)

What it measures, side by side in one run (ratios, no absolute targets):
  1. fit time of EDMDc(dictionary=None) (plain DMDc, full rank, TSQR least squares) and of
     pydmd.DMDc(svd_rank=-1, svd_rank_omega=-1) (no truncation, so both estimate the same full-rank
     operator), on the same trajectory x_{t+1} = A x_t + B u_t + noise, for M in {1e4, 1e5} and
     D in {64, 256}, with D_u = D / 4 controls. PyDMD takes snapshots as columns (D × (M+1)); we pass
     X = traj[:-1], Y = traj[1:], rows are samples. Also the matched (bottleneck) distance between
     the two spectra, which should be ~1e-12.
  2. streaming: partial_fit over M = 1e6 samples (D = 64, D_u = 16) in batches of 1e4, generated on
     the fly; peak traced memory (tracemalloc: numpy reports its buffers to it) against the same
     stream stopped after one batch (M = 1e4), and wall time.
  3. data-parallel: the same M = 1e6 stream split over 2 processes (torch.distributed, gloo, CPU),
     each streaming its half and one `finalize` merging the R factors. Wall time against one
     process on the same batches (with and without the processes' start-up), peak traced memory per
     process, and the matched distance between the two spectra.
      .venv/bin/python benchmarks/koopman.py --multi    (part 3 only)

BLAS is pinned to one thread (set before numpy is imported) so that both libraries run under the
same conditions on a shared machine; oversubscribed OpenBLAS threads made both 5-10× slower here.
"""
import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import sys
import time
import tracemalloc

import numpy as np

from coreinv.identify import match_spectra
from coreinv.koopman import EDMDc


def system(D, Du, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((D, D))
    A *= 0.9 / np.abs(np.linalg.eigvals(A)).max()
    B = 0.3 * rng.standard_normal((D, Du))
    return A, B, rng


def trajectory(M, D, Du, seed=0):
    A, B, rng = system(D, Du, seed)
    U = rng.standard_normal((M, Du))
    E = 0.1 * rng.standard_normal((M, D)) + U @ B.T
    T = np.empty((M + 1, D)); T[0] = rng.standard_normal(D)
    for t in range(M): T[t + 1] = A @ T[t] + E[t]
    return T, U


def timed(f):
    t = time.perf_counter(); out = f(); return out, time.perf_counter() - t


def compare(M, D):
    from pydmd import DMDc
    Du = D // 4
    T, U = trajectory(M, D, Du)
    ours, t_ours = timed(lambda: EDMDc().fit(T[:-1], U, T[1:]))
    ref, t_ref = timed(lambda: DMDc(svd_rank=-1, svd_rank_omega=-1).fit(T.T, U.T))
    dist = match_spectra(ours.eigvals_, ref.eigs)[0]
    return t_ours, t_ref, dist


def stream(M, D=64, Du=16, batch=10_000, seed=0, batches=None):
    "partial_fit over M samples in batches (batch b drawn from its own seed); `batches` picks some."
    A, B, _ = system(D, Du, seed)
    m = EDMDc()
    for b in (range(M // batch) if batches is None else batches):
        rng = np.random.default_rng([seed, b])
        X = rng.standard_normal((batch, D)); U = rng.standard_normal((batch, Du))
        Y = X @ A.T + U @ B.T + 0.1 * rng.standard_normal((batch, D))
        m.partial_fit(X, U, Y)
    return m, A


def _rank(rank, size, init, out, M, batch):
    "One process of the data-parallel run: stream its contiguous share of the batches, then finalize."
    import pickle
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=size)
    nb = M // batch
    tracemalloc.start()
    t, c = time.perf_counter(), time.process_time()
    m, _ = stream(M, batch=batch, batches=range(rank * nb // size, (rank + 1) * nb // size))
    m.finalize()
    res = dict(seconds=time.perf_counter() - t, cpu=time.process_time() - c, peak=tracemalloc.get_traced_memory()[1],
               eigvals=m.eigvals_, n=m.n_samples_seen_)
    with open(f"{out}/{rank}.pkl", "wb") as fh: pickle.dump(res, fh)
    dist.destroy_process_group()


def multiprocess(M=1_000_000, size=2, batch=10_000):
    "The M-sample stream on `size` gloo processes against one process; prints the table."
    import pickle
    import tempfile
    import torch.multiprocessing as mp
    c = time.process_time()
    one, t_one = timed(lambda: stream_peak(M, batch=batch))
    cpu_one = time.process_time() - c
    m1, A, peak1 = one[0], one[1], one[2]
    tmp = tempfile.mkdtemp()
    _, t_multi = timed(lambda: mp.spawn(_rank, args=(size, f"{tmp}/init", tmp, M, batch), nprocs=size))
    ranks = [pickle.load(open(f"{tmp}/{r}.pkl", "rb")) for r in range(size)]
    fit_multi, cpu_multi = max(r["seconds"] for r in ranks), max(r["cpu"] for r in ranks)
    agree = max(match_spectra(r["eigvals"], m1.eigvals_)[0] for r in ranks)
    print(f"\ndata-parallel EDMDc: M = {M:.0e}, D=64, D_u=16, batches of {batch}, gloo on one machine")
    print(f"{'processes':>9} {'wall s':>8} {'fit s':>7} {'wall / 1 proc':>14} {'fit / 1 proc':>13} "
          f"{'CPU s / proc':>13} {'peak MB / proc':>15} {'|λ − λ(1 proc)|':>16}")
    print(f"{1:>9} {t_one:>8.2f} {t_one:>7.2f} {1:>14.2f} {1:>13.2f} {cpu_one:>13.2f} {peak1 / 1e6:>15.1f} {0:>16.1e}")
    print(f"{size:>9} {t_multi:>8.2f} {fit_multi:>7.2f} {t_multi / t_one:>14.2f} {fit_multi / t_one:>13.2f} "
          f"{cpu_multi:>13.2f} {max(r['peak'] for r in ranks) / 1e6:>15.1f} {agree:>16.1e}")
    print(f"every rank saw n = {sorted({r['n'] for r in ranks})}; wall includes starting {size} Python processes "
          f"(importing torch and coreinv); fit is the slowest rank's streaming + finalize; "
          f"CPU is that rank's own CPU time, which a busy machine does not inflate")


def stream_peak(M, **kw):
    tracemalloc.start()
    (m, A), t = timed(lambda: stream(M, **kw))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return m, A, peak, t


def main(quick=False):
    t0 = time.perf_counter()
    cells = [(10_000, 64), (10_000, 256)] + ([] if quick else [(100_000, 64), (100_000, 256)])
    print("EDMDc.fit vs pydmd.DMDc(svd_rank=-1, svd_rank_omega=-1), same trajectory, D_u = D/4, 1 BLAS thread")
    print(f"{'M':>8} {'D':>4} {'EDMDc s':>9} {'PyDMD s':>9} {'PyDMD/EDMDc':>12} {'spectra matched dist':>21}")
    for M, D in cells:
        t_o, t_r, d = compare(M, D)
        print(f"{M:>8} {D:>4} {t_o:>9.2f} {t_r:>9.2f} {t_r / t_o:>12.1f} {d:>21.1e}", flush=True)
    M_big = 100_000 if quick else 1_000_000
    _, _, peak1, t1 = stream_peak(10_000)
    m, A, peakM, tM = stream_peak(M_big)
    batch_bytes = 10_000 * (64 + 16 + 64) * 8
    print(f"\nstreaming partial_fit, D=64, D_u=16, batches of 10^4 (one batch of [X, U, Y] = {batch_bytes / 1e6:.1f} MB)")
    print(f"{'M':>8} {'peak MB':>9} {'peak / batch':>13} {'wall s':>8}")
    print(f"{10_000:>8} {peak1 / 1e6:>9.1f} {peak1 / batch_bytes:>13.2f} {t1:>8.2f}")
    print(f"{M_big:>8} {peakM / 1e6:>9.1f} {peakM / batch_bytes:>13.2f} {tM:>8.2f}")
    print(f"peak(M={M_big:.0e}) / peak(M=1e4) = {peakM / peak1:.2f};  "
          f"spectral error of the stream vs true A: {match_spectra(m.eigvals_, np.linalg.eigvals(A))[0]:.1e}")
    if not quick: multiprocess(M_big)
    print(f"\ntotal benchmark time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    if "--multi" in sys.argv: multiprocess()
    else: main(quick="--quick" in sys.argv)
