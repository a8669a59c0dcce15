"""What the grokking sweep would cost with the main runs' model and schedule (the sweep item of issue 26).

The sweep of the `book` preset trains a smaller model (`sweep_d_model`) at a constant lr. The issue asks for
the main runs' model (d_model 128, d_mlp 512) and schedule (one-cycle over the main run's `steps`). This script
times such runs, each stopped once it groks (test accuracy ≥ 0.95: the trajectory up to τ_grok does not depend
on the stop), and estimates the whole sweep from them. The rule, written before any of these runs:

* the main model replaces the small one in the `book` sweep if its 12 runs (the `book` grid: ω ∈ {1, 2},
  p ∈ {31, 43, 53}, 2 seeds), run two at a time on 2 cores, add at most 10 minutes to the chapter
  (the estimate less the small sweep's time in the last `book` run);
* the estimate: each measured run's CPU seconds per step, linear in p² between the measured p (the full batch
  grows with p²); at each p the steps of the ω = 1 run measured there (linear in p between them), and half
  of them at ω = 2 (the law τ ∝ 1/ω; if it fails there the sweep costs more, not less).

    python tools/grokking_sweep_cost.py run P OMEGA SEED     # one timed run: prints one JSON line
    python tools/grokking_sweep_cost.py record LINE.json ...  # writes results/pilots/grokking_sweep_cost.json

The machine is shared, so each run records its CPU seconds (one thread: about what it takes on a quiet
core) beside its wall seconds and the load average; the estimate uses the CPU seconds.
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "results" / "pilots" / "grokking_sweep_cost.json"
BUDGET_S, SMALL_SWEEP_S = 600.0, 173.6           # the rule's 10 minutes; the small sweep in the last book run
GRID = dict(omegas=(1.0, 2.0), ps=(31, 43, 53), seeds=2, cores=2)
RULE = ("the main model replaces the small one in the book sweep if its 12 runs (ω ∈ {1, 2}, p ∈ {31, 43, 53}, "
        "2 seeds), two at a time on 2 cores, add at most 10 minutes to the chapter; estimated from timed runs "
        "of the main model (one-cycle over the main steps, stopped once grokked): CPU seconds per step linear "
        "in p² between the measured p, the ω = 1 steps linear in p, half of them at ω = 2")


def run(p: int, omega: float, seed: int) -> dict:
    "One main-model run at (p, ω, seed), one-cycle over 3000 steps, stopped at test accuracy ≥ 0.95; timed."
    import torch
    from coreinv.tasks.grokking.data import modular_data
    from coreinv.tasks.grokking.training import grokking_times, log_columns, make_modular_model, train_modular
    torch.set_num_threads(1)
    data = modular_data(p, 0.5, seed=seed)
    model = make_modular_model(p, 2, 128, 4, 512, seed=seed, normalization_type="LN")
    t0, cpu0, load0 = time.time(), time.process_time(), os.getloadavg()[0]
    log, _ = train_modular(model, data, 3000, lr=3e-3, weight_decay=omega, betas=(0.9, 0.98), schedule="onecycle",
                           pct_start=0.1, seed=seed, log_every=10, stop_at=0.95, progress=False)
    c = log_columns(log)
    return dict(p=p, omega=omega, seed=seed, n_train=len(data.train), wall_s=time.time() - t0,
                cpu_s=time.process_time() - cpu0,
                steps=int(c["step"][-1]), times=grokking_times(c), load_start=load0, load_end=os.getloadavg()[0])


def estimate(runs: list[dict]) -> dict:
    "The 12-run sweep's wall time on 2 cores from the measured ω = 1 runs (the rule above)."
    m = sorted((r for r in runs if r["omega"] == 1.0), key=lambda r: r["p"])
    ps = np.array([r["p"] for r in m], float)
    per_step = np.array([r["cpu_s"] / r["steps"] for r in m])
    steps = np.array([r["steps"] for r in m], float)
    cells = []
    for p in GRID["ps"]:
        sps = float(np.interp(p * p, ps ** 2, per_step)) if len(m) > 1 else float(per_step[0] * p * p / ps[0] ** 2)
        n1 = float(np.interp(p, ps, steps))
        for w in GRID["omegas"]:
            cells.append(dict(p=p, omega=w, steps=n1 / w, wall_s=sps * n1 / w))
    total = sum(c["wall_s"] for c in cells) * GRID["seeds"] / GRID["cores"]
    added = total - SMALL_SWEEP_S
    return dict(cells=cells, sweep_wall_s=total, added_s=added, fits=bool(added <= BUDGET_S))


if __name__ == "__main__":
    if sys.argv[1] == "run":
        print(json.dumps(run(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))), flush=True)
    elif sys.argv[1] == "record":
        runs = [json.loads(Path(f).read_text().strip().splitlines()[-1]) for f in sys.argv[2:]]
        est = estimate(runs)
        OUT.write_text(json.dumps(dict(rule=RULE, runs=runs, estimate=est, budget_s=BUDGET_S,
                                       small_sweep_s=SMALL_SWEEP_S,
                                       chosen="main model" if est["fits"] else "small model (the main one does "
                                       "not fit the budget)"), indent=1) + "\n")
        print(json.dumps(est, indent=1))
