"""The one-seed pilots behind the grokking chapter's optimiser (see the comment above `_grok_opt` in
coreinv/presets.py): the `book` run of seed 0 under four changes meant to remove the loss spikes after
τ_grok, judged on τ_grok and the accuracy trace only (no cores). About 30 min on two cores.

    python tools/grokking_pilots.py
"""
import json
import sys

from coreinv.presets import sizes
from coreinv.tasks.modular import grokking_run, grokking_times, log_columns
from coreinv.train import map_processes

CANDIDATES = {"gradient norm clipped at 1": dict(grad_clip=1.0), "peak lr 1.5e-3": dict(lr=1.5e-3),
              "betas (0.9, 0.95)": dict(betas=(0.9, 0.95)), "betas (0.9, 0.9)": dict(betas=(0.9, 0.9))}

if __name__ == "__main__":
    s = sizes("grokking", "book")
    base = dict(p=s.p, train_frac=s.train_frac, steps=s.steps, seed=0, lr=s.lr, betas=tuple(s.betas),
                weight_decay=s.weight_decay, schedule="onecycle", pct_start=s.pct_start, grad_clip=s.grad_clip,
                log_every=s.log_every, snapshot_every=s.steps,
                model_kw=dict(n_layers=s.n_layers, d_model=s.d_model, n_heads=s.n_heads, d_mlp=s.d_mlp))
    runs = map_processes(grokking_run, [base | c for c in CANDIDATES.values()], desc="pilots")
    out = {}
    for name, run in zip(CANDIDATES, runs):
        cols = log_columns(run["log"])
        tau = grokking_times(cols)["tau_grok"]
        after = cols["test_acc"][cols["step"] > tau + s.stable_window] if tau is not None else []
        out[name] = dict(tau_grok=tau, lowest_after=float(min(after)) if len(after) else None,
                         steps_below_0_9=int((after < 0.9).sum()) if len(after) else None,
                         passes=tau is not None and tau <= s.steps / 5 and bool(len(after)) and min(after) >= 0.9)
        print(f"{name:28s} {out[name]}")
    json.dump(out, sys.stdout if len(sys.argv) < 2 else open(sys.argv[1], "w"), indent=1)
