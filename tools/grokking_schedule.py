"""The grokking chapter's learning-rate schedule after the warm-up (issue 42, item 1), decided by one seed-0 run per option.

The one-cycle schedule of earlier versions took the lr to 0, so weight-decay time ∫ lr·ω dt stopped growing and the
runs never reached the 5 × τ_grok window that `inflation` needs. Both options hold the lr constant after the warm-up
(`schedule="warmup"` of `coreinv.train.train`: the one-cycle warm-up over the first 10% of the steps), on the book
model chosen for the budget (d_model 64, d_mlp 256, p = 59, train fraction 0.5, ω = 1, betas (0.9, 0.98)), seed 0,
3000 steps. The rule, written before the runs, judged on τ_grok and weight-decay time only (no core is measured):

* an option qualifies when seed 0 groks (τ_grok: test accuracy ≥ 0.95) and the run's end is ≥ 5 × τ_grok in
  weight-decay time;
* of several that qualify, the chapter takes the smaller τ_grok (the most weight-decay time after grokking within
  the budget); if none qualifies, the one with the larger end ÷ τ_grok ratio, and the chapter says so.

    python tools/grokking_schedule.py        # writes results/pilots/grokking_schedule.json (the chapter shows it)
"""
import json
from pathlib import Path

import numpy as np

from coreinv.tasks.grokking.training import (grokking_run, grokking_times, log_columns, stays_grokked,
                                             weight_decay_time)
from coreinv.train import map_processes

OPTIONS = {"lr 3e-3 held (the chapter's peak lr)": dict(lr=3e-3),
           "lr 1e-3 held (Nanda et al.'s lr)": dict(lr=1e-3)}
BASE = dict(p=59, train_frac=0.5, steps=3000, seed=0, model_kw=dict(n_layers=2, d_model=64, n_heads=4, d_mlp=256),
            betas=(0.9, 0.98), weight_decay=1.0, schedule="warmup", pct_start=0.1, log_every=10)
WINDOW = 5.0
RULE = (f"an option qualifies when seed 0 groks and the run's end is ≥ {WINDOW:g} × τ_grok in weight-decay time "
        "∫lr·ω dt; of several, the smaller τ_grok; if none, the larger end ÷ τ_grok ratio")
OUT = Path(__file__).resolve().parents[1] / "results" / "pilots" / "grokking_schedule.json"


def judge(run) -> dict:
    "τ_grok, weight-decay time at the end ÷ at τ_grok, and the accuracy trace of one run."
    cols = log_columns(run["log"])
    tau = grokking_times(cols)["tau_grok"]
    wd = weight_decay_time(cols, BASE["weight_decay"])
    ratio = None if tau is None else float(wd[-1] / np.interp(tau, cols["step"], wd))
    stay = stays_grokked(cols, tau, window=50)
    return dict(tau_grok=tau, wd_end_over_tau=ratio, qualifies=ratio is not None and ratio >= WINDOW,
                lowest_after=stay["min_test_acc"],
                trace={k: cols[k][::2].tolist() for k in ("step", "train_acc", "test_acc", "lr")})


def write_record(out: dict, chosen: str, path: Path = OUT, **fields) -> None:
    "Write a pilot record (the rule, the base setup, the options, each run's judgement, the choice) and print it."
    record = dict(fields, runs=out, chosen=chosen, qualified=any(r["qualifies"] for r in out.values()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for n, r in out.items():
        print(n, {k: v for k, v in r.items() if k != "trace"})
    print("chosen:", chosen, "->", path)


if __name__ == "__main__":
    runs = map_processes(grokking_run, [BASE | o for o in OPTIONS.values()], len(OPTIONS), desc="options")
    out = {name: judge(r) for name, r in zip(OPTIONS, runs)}
    ok = [n for n, r in out.items() if r["qualifies"]]
    chosen = (min(ok, key=lambda n: out[n]["tau_grok"]) if ok else
              max(out, key=lambda n: out[n]["wd_end_over_tau"] or 0.0))
    write_record(out, chosen, rule=RULE, base=json.loads(json.dumps(BASE)), options=OPTIONS)
