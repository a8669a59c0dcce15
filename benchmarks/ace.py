"""Speed of ACE extraction, measured side by side in one run (ratios, no absolute targets asserted).

    .venv/bin/python benchmarks/ace.py            # N=8192, D=128, O in {1, 4, 113}

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
pos=None (every position: the joint pass where it is exact, else one JVP pass per position),
against one plain forward pass of the whole model over the same tokens.
Targets (issue 15): jvp ≤ 3× one forward pass of the downstream function and ≥ 20× the naive loop
at every O; fit_hook ≤ 2× one forward pass of the whole model at every layer. forward and jvp are timed interleaved, `repeats` times each, and the
minimum is kept (the machine is shared); gramian and naive are timed once after a warm-up.
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


def run_hook(n_layers: int = 4, d_model: int = 128, n_ctx: int = 32, batch: int = 64, repeats: int = 3,
             seed: int = 0) -> list[dict]:
    "fit_hook at each layer of a small HookedTransformer, against one plain forward of the whole model."
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
        for pos in (-1, None):
            fit = lambda: ACE(batch_size=batch).fit_hook(model, tokens, hook, readout, pos=pos)
            ace = fit()                                                            # warm-up
            t_fwd = t_fit = float("inf")
            for _ in range(repeats):
                t_fwd = min(t_fwd, _time(forward, 1))
                t_fit = min(t_fit, _time(fit, 1))
            rows.append(dict(layer=layer, pos=pos, joint=ace.joint_, forward=t_fwd, fit_hook=t_fit))
    return rows


def print_hook_table(rows: list[dict]) -> None:
    "Print the fit_hook rows as a markdown table."
    print("| layer | pos | joint pass | forward of the model (s) | fit_hook (s) | fit_hook / forward |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layer']} | {r['pos']} | {'yes' if r['joint'] else 'no'} | {r['forward']:.4f} "
              f"| {r['fit_hook']:.4f} | {r['fit_hook'] / r['forward']:.2f}× |")


def print_table(rows: list[dict], N: int | None = None, D: int | None = None) -> None:
    "Print the rows as a markdown table of times and ratios."
    base = rows[0]["jvp"]
    print("| O | forward (s) | jvp (s) | gramian (s) | naive (s, extrap.) | naive / jvp | jvp / forward "
          "| raw torch.func.jvp / forward | gramian / jvp | jvp / jvp(O=%d) |" % rows[0]["O"])
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['O']} | {r['forward']:.3f} | {r['jvp']:.3f} | {r['gramian']:.3f} | {r['naive']:.1f} "
              f"| {r['naive'] / r['jvp']:.0f}× | {r['jvp'] / r['forward']:.2f}× | {r['raw_jvp'] / r['forward']:.2f}× "
              f"| {r['gramian'] / r['jvp']:.1f}× "
              f"| {r['jvp'] / base:.2f}× |")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, default=8192)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: ratios are steadier on a shared machine)")
    ap.add_argument("--hook", action="store_true", help="only the fit_hook measurement")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    N, D = args.N, args.D
    print(f"ACE benchmark, N={N}, D={D}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    import os
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if not args.hook:
        print("naive: per-sample × per-output autograd.grad, timed on 256 samples and extrapolated to N")
        print_table(run(N=N, D=D))
    print("\nfit_hook on a 4-layer HookedTransformer (d_model 128, 64 sequences of 32 tokens, O = 4)")
    print_hook_table(run_hook())
