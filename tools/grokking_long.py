"""Does the necessary core grow at all at the book's scale? One seed of the book model trained 4 × as long.

The chapter's runs end at 6–7 × τ_grok in weight-decay time; the paper's necessary dimensions grew ~15 → ~60 over
far longer training at p = 113. This pilot trains seed 0 of the `book` model (its p, sizes, optimiser and
lr held after a warm-up over the same 500 steps as the book runs) for 4 × the book's steps, and reads the core at
the chapter's "after" snapshots every 2,500 steps: at each checkpoint T, the last *grokked* snapshot at or before T
(the chapter's rule: its own logged test accuracy and every one within ± log_every steps ≥ thr_final), with its
sufficient and necessary k (the `=`-only rule and the removal at every position), the embedding's active Fourier
frequencies, and where it lies in weight-decay time. It is not part of the book build; the chapter shows its record.

The rule, written before the run: the necessary k **grows** when, at the core layer of the last "after", the
necessary k there is ≥ thr_inflate (2) × the necessary k at "at" (the first grokked snapshot ≥ τ_grok), the
chapter's inflation threshold; it **does not grow** when it stays below that at every "after"; the sufficient k and
the active frequencies are reported beside it.

    nice -n 19 python tools/grokking_long.py     # writes results/pilots/grokking_long.json (~15 min on one core)
"""
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from coreinv.tasks.grokking.cores import core_layer, grokked_snapshots, track_cores
from coreinv.tasks.grokking.data import modular_data
from coreinv.tasks.grokking.necessity import core_at_every_position
from coreinv.tasks.grokking.presets import SIZES
from coreinv.tasks.grokking.training import (grokking_run, grokking_times, log_columns, make_modular_model,
                                             weight_decay_time)

# GROKKING_LONG_FACTOR / _EVERY / _OUT: a shorter trial of this script (its test), not the pilot
FACTOR = float(os.environ.get("GROKKING_LONG_FACTOR", 4))
EVERY, SEED = int(os.environ.get("GROKKING_LONG_EVERY", 2500)), 0
OUT = Path(os.environ.get("GROKKING_LONG_OUT", Path(__file__).resolve().parents[1] / "results" / "pilots" / "grokking_long.json"))
RULE = ("the necessary k grows when, at the core layer of the last 'after' (the last grokked snapshot), it is "
        "≥ thr_inflate × the necessary k at 'at' (the first grokked snapshot ≥ τ_grok); it does not grow when it "
        "stays below that at every 'after' (every 2,500 steps)")


def main():
    torch.set_num_threads(1)
    s = SIZES.at("book")
    steps = int(FACTOR * s.steps)
    model_kw = dict(n_layers=s.n_layers, d_model=s.d_model, n_heads=s.n_heads, d_mlp=s.d_mlp,
                    normalization_type=s.normalization)
    t0 = time.time()
    run = grokking_run(s.p, s.train_frac, steps, SEED, model_kw=model_kw, lr=s.lr, betas=tuple(s.betas),
                       weight_decay=s.weight_decay, schedule=s.schedule, pct_start=s.pct_start * s.steps / steps,
                       grad_clip=s.grad_clip, loss_dtype=s.loss_dtype, log_every=s.log_every,
                       snapshot_every=s.snapshot_every)
    train_s = time.time() - t0
    cols = log_columns(run["log"])
    times = grokking_times(cols)
    tg = times["tau_grok"]
    wd = weight_decay_time(cols, s.weight_decay)
    wd_ratio = lambda k: None if tg is None else float(np.interp(k, cols["step"], wd) / np.interp(tg, cols["step"], wd))
    grokked, at, _ = grokked_snapshots(cols, run["snapshots"], tg, window=s.log_every, level=s.thr_final)
    afters = {T: max((k for k in grokked if k <= T), default=None) for T in range(EVERY, steps + 1, EVERY)}
    picked = sorted({k for k in [at, *afters.values()] if k is not None})
    model, data = make_modular_model(s.p, seed=SEED, **model_kw), modular_data(s.p, s.train_frac, seed=SEED)
    t0 = time.time()
    rows = {r.step: r for r in track_cores(model, {k: run["snapshots"][k] for k in picked}, data, processes=1,
                                           progress=True, core_fn=core_at_every_position)}
    analyse_s = time.time() - t0
    last_k = afters[max(afters)]
    L = core_layer(rows[last_k]) if last_k is not None else 0

    def read(k):
        if k is None: return None
        c = rows[k].cores[L]
        return dict(step=k, over_tau_grok=None if tg is None else k / tg, wd_over_tau=wd_ratio(k),
                    suff_k=c.ace_dims.bounded("k_sufficient")[0], nec_k=c.ace_dims.bounded("k_necessary")[0],
                    nec_k_is_lower_bound=c.ace_dims.bounded("k_necessary")[1],
                    nec_k_every=c.every.dims.bounded("k_necessary")[0] if c.every.measurable else None,
                    active_freqs=rows[k].n_active, test_acc=c.test_acc)

    table = {str(T): read(k) for T, k in afters.items()}
    at_row, last = read(at), table[str(max(afters))]
    grows = (at_row is not None and last is not None and last["nec_k"] >= s.thr_inflate * at_row["nec_k"])
    record = dict(rule=RULE, base=dict(p=s.p, steps=steps, seed=SEED, book_steps=s.steps, **model_kw,
                                       lr=s.lr, weight_decay=s.weight_decay, schedule=s.schedule,
                                       warmup_steps=round(s.pct_start * s.steps)),
                  tau_fit=times["tau_fit"], tau_grok=tg, core_layer=L, n_grokked_snapshots=len(grokked),
                  n_snapshots=len(run["snapshots"]), at=at_row, after_every=table, grows=bool(grows),
                  thr_inflate=s.thr_inflate, train_s=train_s, analyse_s=analyse_s,
                  trace={k: cols[k][::5].tolist() for k in ("step", "test_acc")})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in record.items() if k != "trace"}, indent=1))
    print("->", OUT)


if __name__ == "__main__":
    main()
