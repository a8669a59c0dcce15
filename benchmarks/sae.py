"""Benchmark: the TopK SAE trainer of coreinv.sae against sae-lens's, on the same activations and width.

Run:  .venv/bin/python benchmarks/sae.py            (d_in = 64, widths 4x and 8x, about 1-2 minutes)
      .venv/bin/python benchmarks/sae.py --quick    (width 4x only, fewer steps)

sae-lens is optional: without it only our trainer is timed. Its dependencies install beside the
project's pins (checked with `pip install --dry-run sae-lens==6.54.12`: nothing pinned changes), so
one way to get it without touching the project's environment is
      pip install --target /tmp/saelens-pkgs --no-deps sae-lens==6.54.12 <its missing deps>
      PYTHONPATH=/tmp/saelens-pkgs .venv/bin/python benchmarks/sae.py

What it measures, side by side in one run (a ratio, no absolute target):
  tokens per second of training, for the same N activations (d_in, Gaussian with a decaying
  spectrum plus sparse planted directions), the same width d_sae, k, batch size, number of steps
  and learning rate:
    * ours     SparseAutoencoder("topk", d_sae, k, steps, batch_size, lr).fit(X) — TopK + AuxK,
               decoder rows kept unit-norm (gradient projection + renormalisation), per-step history;
    * sae-lens SAETrainer(SAETrainerConfig(...), TopKTrainingSAE(TopKTrainingSAEConfig(d_in, d_sae, k)),
               data provider = random batches of the same X).fit() — its TopK + AuxK, no wandb,
               no checkpoints, constant lr.
  Both run in float32 on the CPU with one thread, each timed `repeats` times interleaved, the
  minimum kept (the machine is shared). The FVU of both trained SAEs on X is printed as a sanity
  check that both trained comparably.
"""
import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
os.environ.setdefault("TQDM_DISABLE", "1")        # sae-lens's trainer always shows a bar

import sys
import time
from pathlib import Path

import torch

try:
    from coreinv.sae import SparseAutoencoder, sae_metrics
except ImportError:                                 # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from coreinv.sae import SparseAutoencoder, sae_metrics

torch.set_num_threads(1)


def activations(N: int = 32768, d_in: int = 64, n_atoms: int = 512, seed: int = 0) -> torch.Tensor:
    "N activations [N, d_in]: a decaying Gaussian background plus ~4 sparse planted directions each."
    g = torch.Generator().manual_seed(seed)
    atoms = torch.randn(n_atoms, d_in, generator=g)
    atoms /= atoms.norm(dim=1, keepdim=True)
    codes = torch.rand(N, n_atoms, generator=g) * (torch.rand(N, n_atoms, generator=g) < 4 / n_atoms)
    background = torch.randn(N, d_in, generator=g) * torch.logspace(0, -1.5, d_in)
    return 3 * codes @ atoms + 0.3 * background


def ours(X, d_sae, k, steps, batch_size, lr):
    return SparseAutoencoder("topk", d_sae=d_sae, k=k, steps=steps, batch_size=batch_size, lr=lr,
                             progress=False).fit(X)


def sae_lens_trainer(X, d_sae, k, steps, batch_size, lr):
    from sae_lens import SAETrainer, TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig

    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=X.shape[1], d_sae=d_sae, k=k, dtype="float32",
                                                device="cpu"))
    cfg = SAETrainerConfig(total_training_samples=steps * batch_size, train_batch_size_samples=batch_size,
                           lr=lr, lr_end=lr, device="cpu", dead_feature_window=200, feature_sampling_window=10 ** 9)
    g = torch.Generator().manual_seed(0)

    def batches():
        while True:
            yield X[torch.randint(0, len(X), (batch_size,), generator=g)]
    return SAETrainer(cfg, sae, batches()).fit()


def main(quick: bool = False, repeats: int = 2):
    try:
        import sae_lens
        version = sae_lens.__version__
    except ImportError:
        version = None
    d_in, k, batch_size, lr = 64, 16, 1024, 2e-3
    steps = 100 if quick else 300
    X = activations(d_in=d_in)
    print(f"TopK SAE training, N={len(X)} activations, d_in={d_in}, k={k}, batch {batch_size}, {steps} steps, "
          f"lr {lr}, float32, 1 thread; sae-lens {version or 'not installed'}")
    print(f"{'width':>6} {'d_sae':>6} {'ours tok/s':>11} {'sae-lens tok/s':>15} {'ours / sae-lens':>16} "
          f"{'FVU ours':>9} {'FVU sae-lens':>13}")
    rows = []
    for width in ((4,) if quick else (4, 8)):
        d_sae, t_ours, t_lens, fvu_lens = width * d_in, float("inf"), float("inf"), float("nan")
        for _ in range(repeats):
            t = time.perf_counter(); est = ours(X, d_sae, k, steps, batch_size, lr)
            t_ours = min(t_ours, time.perf_counter() - t)
            if version:
                t = time.perf_counter(); lens = sae_lens_trainer(X, d_sae, k, steps, batch_size, lr)
                t_lens = min(t_lens, time.perf_counter() - t)
        fvu_ours = sae_metrics(est, X)["fvu"]
        if version: fvu_lens = sae_metrics(lens, X)["fvu"]
        tok = steps * batch_size
        r = dict(width=width, d_sae=d_sae, ours=tok / t_ours, lens=tok / t_lens if version else float("nan"))
        rows.append(r)
        print(f"{width:>5}x {d_sae:>6} {r['ours']:>11.0f} {r['lens']:>15.0f} {r['ours'] / r['lens']:>16.2f} "
              f"{fvu_ours:>9.3f} {fvu_lens:>13.3f}", flush=True)
    return rows


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
