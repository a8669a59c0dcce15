"""The pilots behind the grokking chapter's optimiser (see the comment above `_grok_opt` in coreinv/tasks/grokking/presets.py).

Each candidate is the `book` run of the time (d_model 128, p = 59, 3000 steps, one-cycle lr; issue 42 has since
moved the book to d_model 64, 3500 steps and a held lr) with ONE change, judged on
τ_grok and the test-accuracy trace only (no cores are measured). The rule, written before any of these runs:

* a candidate passes a seed when τ_grok ≤ 700 and no logged test accuracy after τ_grok + 50 is below 0.9;
* it passes when it passes seeds 0, 1 and 2; seeds run in stages (seed 0 for every candidate, then seeds 1
  and 2 for those still passing): a candidate is dropped at its first failing seed;
* if several pass, the chapter takes the one with the lowest mean τ_grok (the most weight-decay time after
  grokking inside the `book` budget); if none passes, the setup stays and the chapter says so.

The candidates, in the order they were first tried: gradient-norm clipping at 1, the peak lr halved to
1.5e-3, β₂ = 0.95 and β₂ = 0.9 (tried before this record existed; run here under its rule by issue 42, so that
the chapter's table holds all eleven); then (issue 26) β₂ = 0.999; no LayerNorm with a float64 loss (Nanda et al.'s recipe); lr halved
with ω doubled (lr·ω held). Four more from the literature (issue 42, item 2; tried by hand first, then run
here under the same rule): Nanda et al.'s schedule (a 10-step linear warm-up from 0, then lr 1e-3 held), the
same without LayerNorm, the StableMax loss (Prieto et al. 2025) and Adam's ε = 1e-3 (Thilak et al. 2022; the
chapter's is PyTorch's 1e-8).

    python tools/grokking_pilots.py            # runs every candidate, writes results/pilots/grokking.json
    python tools/grokking_pilots.py NAME ...   # runs the named candidates only; the record keeps the others' runs
"""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from coreinv.tasks.grokking.presets import SIZES
from coreinv.tasks.grokking.training import grokking_run, grokking_times, log_columns
from coreinv.train import map_processes

CANDIDATES = {"gradient-norm clipping at 1": dict(grad_clip=1.0),
              "peak lr 1.5e-3": dict(lr=1.5e-3),
              "betas (0.9, 0.95)": dict(betas=(0.9, 0.95)),
              "betas (0.9, 0.9)": dict(betas=(0.9, 0.9)),
              "betas (0.9, 0.999)": dict(betas=(0.9, 0.999)),
              "no LayerNorm, float64 loss": dict(model_kw=dict(normalization_type=None), loss_dtype="float64"),
              "lr 1.5e-3, ω = 2 (lr·ω held)": dict(lr=1.5e-3, weight_decay=2.0),
              "Nanda's schedule (10-step linear warm-up, lr 1e-3)": dict(schedule="linear", pct_start=10 / 3000,
                                                                        lr=1e-3),
              "Nanda's schedule, no LayerNorm": dict(schedule="linear", pct_start=10 / 3000, lr=1e-3,
                                                     model_kw=dict(normalization_type=None)),
              "StableMax loss": dict(loss="stablemax"),
              "Adam ε = 1e-3": dict(eps=1e-3)}
TAU_MAX, LEVEL, SEEDS = 700, 0.9, (0, 1, 2)
RULE = (f"a candidate passes a seed when τ_grok ≤ {TAU_MAX} and no logged test accuracy after τ_grok + 50 is "
        f"below {LEVEL}; it passes when it passes seeds {', '.join(map(str, SEEDS))} (seed 0 first, then seeds 1 "
        "and 2 for the candidates still passing); of several passing, the lowest mean τ_grok is chosen")
OUT = Path(__file__).resolve().parents[1] / "results" / "pilots" / "grokking.json"


def make_record(out: dict, s, kept: dict | None = None) -> dict:
    """The JSON record the chapter reads (`coreinv.results.pilot_record('grokking')`): rule, runs, traces, choice.
    `kept`: the runs of an earlier record, for the candidates not run now."""
    new = {n: {str(sd): {k: v for k, v in r.items() if k != "log"}
               | {"trace": {k: log_columns(r["log"])[k][::2].tolist() for k in ("step", "test_acc")}}
               for sd, r in by_seed.items()} for n, by_seed in out.items()}
    merged = (kept or {}) | new
    runs = {n: merged[n] for n in CANDIDATES if n in merged}
    passing = [n for n, by_seed in runs.items()
               if len(by_seed) == len(SEEDS) and all(r["passes"] for r in by_seed.values())]
    chosen = min(passing, key=lambda n: sum(r["tau_grok"] for r in runs[n].values())) if passing else None
    return {"rule": RULE, "base": f"the book run: p {s.p}, d_model {s.d_model}, {s.steps} steps, lr {s.lr} "
                                  f"one-cycle, betas {tuple(s.betas)}, ω {s.weight_decay}, LayerNorm, float32 loss",
            "candidates": {n: json.loads(json.dumps(c, default=str)) for n, c in CANDIDATES.items()},
            "runs": runs, "chosen": chosen}


def judge(run, s) -> dict:
    cols = log_columns(run["log"])
    tau = grokking_times(cols)["tau_grok"]
    after = cols["test_acc"][cols["step"] > tau + s.stable_window] if tau is not None else []
    low = float(min(after)) if len(after) else None
    return dict(tau_grok=tau, lowest_after=low, steps_below=int((after < LEVEL).sum()) if len(after) else None,
                passes=tau is not None and tau <= TAU_MAX and low is not None and low >= LEVEL)


if __name__ == "__main__":
    # the book setup these pilots were run against (before issue 42 changed p, the model, steps and schedule)
    s = SimpleNamespace(**(dict(SIZES.at("book")) | dict(p=59, d_model=128, d_mlp=512, steps=3000, seeds=(0, 1, 2))))
    model_kw = dict(n_layers=s.n_layers, d_model=s.d_model, n_heads=s.n_heads, d_mlp=s.d_mlp)
    base = dict(p=s.p, train_frac=s.train_frac, steps=s.steps, lr=s.lr, betas=tuple(s.betas),
                weight_decay=s.weight_decay, schedule="onecycle", pct_start=s.pct_start, grad_clip=s.grad_clip,
                log_every=s.log_every, snapshot_every=s.steps)

    def job(name, seed):
        c = dict(CANDIDATES[name])
        mk = model_kw | c.pop("model_kw", {})
        return base | c | dict(seed=seed, model_kw=mk)

    names = sys.argv[1:] or list(CANDIDATES)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        sys.exit(f"unknown candidate(s) {unknown}; the candidates are {list(CANDIDATES)}")
    kept = json.loads(OUT.read_text(encoding="utf-8"))["runs"] if OUT.exists() else {}
    out = {name: {} for name in names}
    alive = list(names)
    for stage in ((0,), (1, 2)):
        todo = [(n, sd) for n in alive for sd in stage]
        if not todo: break
        runs = map_processes(grokking_run, [job(n, sd) for n, sd in todo], len(todo), desc=f"pilots, seeds {stage}")
        for (n, sd), run in zip(todo, runs):
            out[n][sd] = judge(run, s) | dict(log=run["log"])
            print(n, sd, {k: v for k, v in out[n][sd].items() if k != "log"}, flush=True)
        alive = [n for n in alive if all(r["passes"] for r in out[n].values())]
    record = make_record(out, s, kept)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print("chosen:", record["chosen"], "->", OUT)
