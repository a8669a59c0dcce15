"""Speed of ACE extraction, measured side by side in one run (ratios, no absolute targets asserted).

    .venv/bin/python benchmarks/ace.py            # N=8192, D=128, O in {1, 4, 113}, then fit_hook
    .venv/bin/python benchmarks/ace.py --hook     # fit_hook only
    .venv/bin/python benchmarks/ace.py --check    # exit 1 when a ratio exceeds its target by > 25%

The downstream function is an attention-free residual block (LayerNorm, MLP with 4·D hidden units,
GELU) followed by a linear readout to O outputs. For every O it times, on the same activations:
  * forward  one plain forward pass of the downstream function over the N samples (batches of 1024);
  * jvp      ACE(method="jvp").fit: one forward + one JVP per batch, SVD included;
  * raw jvp  torch.func.jvp of the downstream function alone, the floor for the jvp form;
  * gramian  ACE(method="gramian").fit: O vector-Jacobian products per batch (vmapped);
  * naive    per-sample, per-output torch.autograd.grad calls forming J_n h̃_n. It is timed on a
             subset of n_naive samples and extrapolated linearly to N (the loop is per sample, so the
             cost is linear in N).
It also measures the user's case (`--hook`, part of the default run): `ACE.fit_hook` on a 4-layer
HookedTransformer at blocks.{0,1,2,3}.hook_resid_post, with pos=-1 (one position, the readout's) and
pos=None (every position), beside its floors, all timed interleaved in the same run:
  * forward     one plain forward pass of the whole model over the same tokens;
  * to hook     the forward pass up to the hook (`stop_at_layer`);
  * raw jvp     torch.func.jvp of the blocks after the hook alone (`start_at_layer`), the tangent at
                the last position: the floor of pos=-1 is to hook + raw jvp.
Targets (issue 27), as ratios in one run:
  * ACE.fit (jvp) ≤ 1.1 × raw torch.func.jvp of the same function, every O;
  * fit_hook, pos=-1 ≤ 1.2 × (to hook + raw jvp) at every layer, and ≤ 2.5 × forward at the last;
  * fit_hook, pos=None ≤ 0.5 × T × fit_hook(pos=-1) on the layers where the joint pass does not hold.
`--check` exits 1 when a ratio exceeds its target by more than 25% (a regression guard outside the
unit tests, which never time anything). forward, the floors and the fits are timed interleaved,
`repeats` times each, keeping the minimum (the machine is shared); gramian and naive are timed once
after a warm-up.
"""
from __future__ import annotations

import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

try:
    from coreinv.ace import ACE
except ImportError:                                     # run from a checkout without install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from coreinv.ace import ACE


class Downstream(nn.Module):
    "h ↦ readout(h + MLP(LN(h))): [n, D] → [n, O]."
    def __init__(self, D: int, O: int, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.ln = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.readout = nn.Linear(D, O)
        for p in self.parameters(): p.requires_grad_(False)

    def forward(self, h):
        return self.readout(h + self.mlp(self.ln(h))).log_softmax(-1) if self.readout.out_features > 1 \
            else self.readout(h + self.mlp(self.ln(h)))


def _time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter(); fn(); best = min(best, time.perf_counter() - t)
    return best


def naive_jh(f, acts: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    "J_n h̃_n by one autograd call per sample and per output: [n, O]."
    out = []
    for h in acts:
        h = h.clone().requires_grad_(True)
        y = f(h[None])[0]
        y = y - y.mean() if y.numel() > 1 else y
        J = torch.stack([torch.autograd.grad(y[o], h, retain_graph=True)[0] for o in range(y.numel())])
        out.append(J @ (h.detach() - mean))
    return torch.stack(out)


def run(N: int = 8192, D: int = 128, Os=(1, 4, 113), n_naive: int = 256, repeats: int = 7,
        batch_size: int = 1024, seed: int = 0) -> list[dict]:
    "Time forward, jvp, gramian and the naive loop for each O; return one row per O."
    torch.set_grad_enabled(True)
    g = torch.Generator().manual_seed(seed)
    acts = torch.randn(N, D, generator=g) @ (torch.randn(D, D, generator=g) / D ** 0.5)
    rows = []
    for O in Os:
        f = Downstream(D, O, seed)
        def forward():
            with torch.no_grad():
                for i in range(0, N, batch_size): f(acts[i:i + batch_size])
        def raw_jvp():                        # torch.func.jvp alone: the floor for ACE's jvp form
            with torch.no_grad():
                for i in range(0, N, batch_size):
                    h = acts[i:i + batch_size]
                    torch.func.jvp(f, (h,), (h,))
        jvp_fit = lambda: ACE("jvp", batch_size=batch_size).fit(acts, f)
        forward(); raw_jvp(); jvp_fit()                                          # warm-up
        t_fwd = t_raw = t_jvp = float("inf")
        for _ in range(repeats):              # interleaved, so a busy spell on a shared machine hits all
            t_fwd = min(t_fwd, _time(forward, 1))
            t_raw = min(t_raw, _time(raw_jvp, 1))
            t_jvp = min(t_jvp, _time(jvp_fit, 1))
        ACE("gramian", batch_size=batch_size).fit(acts[:batch_size], f)          # warm-up (torch.func)
        t_gram = _time(lambda: ACE("gramian", batch_size=batch_size).fit(acts, f), 1)
        mean = acts.mean(0)
        t_naive_sub = _time(lambda: naive_jh(f, acts[:n_naive], mean), 1)
        t_naive = t_naive_sub / n_naive * N
        rows.append(dict(O=O, forward=t_fwd, raw_jvp=t_raw, jvp=t_jvp, gramian=t_gram, naive=t_naive))
    return rows


TARGETS = {"fit / raw jvp": 1.1, "pos=-1 / floor": 1.2, "pos=-1 / forward, last layer": 2.5,
           "pos=None / (T × pos=-1)": 0.5}


def run_hook(n_layers: int = 4, d_model: int = 128, n_ctx: int = 32, batch: int = 64, repeats: int = 5,
             seed: int = 0) -> list[dict]:
    "fit_hook at each layer of a small HookedTransformer, beside its floors (see the module docstring)."
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        cfg = HookedTransformerConfig(n_layers=n_layers, d_model=d_model, n_ctx=n_ctx, d_head=32,
                                      n_heads=d_model // 32, d_mlp=4 * d_model, d_vocab=512, act_fn="gelu",
                                      seed=seed)
        model = HookedTransformer(cfg).eval()
    for p in model.parameters(): p.requires_grad_(False)
    tokens = torch.randint(0, 512, (batch, n_ctx), generator=torch.Generator().manual_seed(seed))
    answers = torch.arange(4)
    readout = lambda logits, x: logits.log_softmax(-1)[..., answers]              # [b, pos, 4]
    def forward():
        with torch.no_grad(): model(tokens)
    forward()
    rows = []
    for layer in range(n_layers):
        hook = f"blocks.{layer}.hook_resid_post"
        with torch.no_grad():
            resid = model(tokens, stop_at_layer=layer + 1)                         # [b, pos, d_model]
        tangent = torch.zeros_like(resid)
        tangent[:, -1] = resid[:, -1] - resid[:, -1].mean(0)
        def to_hook():
            with torch.no_grad(): model(tokens, stop_at_layer=layer + 1)
        def raw_jvp():                        # the blocks after the hook alone: the floor of the JVP
            with torch.no_grad():
                torch.func.jvp(lambda r: readout(model(r, start_at_layer=layer + 1), tokens)[:, -1],
                               (resid,), (tangent,))
        fits = {pos: (lambda pos=pos: ACE(batch_size=batch).fit_hook(model, tokens, hook, readout, pos=pos,
                                                                     progress=False)) for pos in (-1, None)}
        joint = fits[None]().joint_; fits[-1](); to_hook(); raw_jvp()           # warm-up
        t = dict(forward=float("inf"), to_hook=float("inf"), raw_jvp=float("inf"), fit=float("inf"),
                 fit_all=float("inf"))
        for _ in range(repeats):
            for k, f in (("forward", forward), ("to_hook", to_hook), ("raw_jvp", raw_jvp), ("fit", fits[-1]),
                         ("fit_all", fits[None])):
                t[k] = min(t[k], _time(f, 1))
        rows.append(dict(layer=layer, joint=joint, T=n_ctx, **t))
    return rows


def print_hook_table(rows: list[dict]) -> None:
    "Print the fit_hook rows as a markdown table: times, ratios, and each ratio's floor or target."
    print("| layer | forward (s) | to hook (s) | raw jvp after it (s) | fit_hook pos=−1 (s) "
          "| pos=−1 / forward | pos=−1 / (to hook + raw jvp) [≤ 1.2] | fit_hook pos=None (s) | pos=None path "
          "| pos=None / (T × pos=−1) [≤ 0.5] |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        floor = r["to_hook"] + r["raw_jvp"]
        print(f"| {r['layer']} | {r['forward']:.4f} | {r['to_hook']:.4f} | {r['raw_jvp']:.4f} | {r['fit']:.4f} "
              f"| {r['fit'] / r['forward']:.2f}× (floor {floor / r['forward']:.2f}×) | {r['fit'] / floor:.2f}× "
              f"| {r['fit_all']:.4f} | {'joint' if r['joint'] else 'not joint'} "
              f"| {r['fit_all'] / (r['T'] * r['fit']):.3f} |")


def check(rows: list[dict] | None, hook_rows: list[dict] | None, slack: float = 1.25) -> list[str]:
    "The ratios above their targets by more than `slack` (empty: every target met within it)."
    bad = []
    def over(name, value, where):
        if value > slack * TARGETS[name]: bad.append(f"{name} = {value:.2f} at {where} (target {TARGETS[name]})")
    for r in rows or []:
        over("fit / raw jvp", r["jvp"] / r["raw_jvp"], f"O={r['O']}")
    for r in hook_rows or []:
        over("pos=-1 / floor", r["fit"] / (r["to_hook"] + r["raw_jvp"]), f"layer {r['layer']}")
        if not r["joint"]: over("pos=None / (T × pos=-1)", r["fit_all"] / (r["T"] * r["fit"]), f"layer {r['layer']}")
    if hook_rows:
        last = hook_rows[-1]
        over("pos=-1 / forward, last layer", last["fit"] / last["forward"], f"layer {last['layer']}")
        first = hook_rows[0]
        if last["fit"] / last["forward"] > slack * first["fit"] / first["forward"]:
            bad.append("fit_hook pos=-1 / forward does not fall with depth")
    return bad


def print_table(rows: list[dict], N: int | None = None, D: int | None = None) -> None:
    "Print the rows as a markdown table of times and ratios."
    base = rows[0]["jvp"]
    print("| O | forward (s) | raw torch.func.jvp (s) | jvp (s) | gramian (s) | naive (s, extrap.) | naive / jvp "
          "| jvp / forward (floor: raw jvp / forward) | jvp / raw jvp [≤ 1.1] | gramian / jvp | jvp / jvp(O=%d) |"
          % rows[0]["O"])
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['O']} | {r['forward']:.3f} | {r['raw_jvp']:.3f} | {r['jvp']:.3f} | {r['gramian']:.3f} "
              f"| {r['naive']:.1f} | {r['naive'] / r['jvp']:.0f}× "
              f"| {r['jvp'] / r['forward']:.2f}× ({r['raw_jvp'] / r['forward']:.2f}×) | {r['jvp'] / r['raw_jvp']:.2f}× "
              f"| {r['gramian'] / r['jvp']:.1f}× | {r['jvp'] / base:.2f}× |")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, default=8192)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: ratios are steadier on a shared machine)")
    ap.add_argument("--hook", action="store_true", help="only the fit_hook measurement")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when a ratio exceeds its target (TARGETS) by more than 25%%")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    N, D = args.N, args.D
    print(f"ACE benchmark, N={N}, D={D}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    import os
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    rows = None
    if not args.hook:
        print("naive: per-sample × per-output autograd.grad, timed on 256 samples and extrapolated to N")
        rows = run(N=N, D=D)
        print_table(rows)
    print("\nfit_hook on a 4-layer HookedTransformer (d_model 128, 64 sequences of T = 32 tokens, O = 4)")
    hook_rows = run_hook()
    print_hook_table(hook_rows)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if args.check:
        bad = check(rows, hook_rows)
        print("\ncheck (targets × 1.25):", "all met" if not bad else "; ".join(bad))
        sys.exit(1 if bad else 0)
