"""`ACE.fit_hook` on a TransformerBridge, under whichever TransformerLens is installed (ratios, nothing asserted).

    .venv/bin/python benchmarks/bridge.py         # TransformerLens 3.9, the book's environment
    .venv-tl4/bin/python benchmarks/bridge.py     # TransformerLens 4.x (`make test-tl4` creates .venv-tl4/)

fit_hook's fast path, starting the JVP at the hook (`start_at_layer`), is a `HookedTransformer` path; a
bridge has no such entry point, so on a bridge fit_hook runs the whole model with the activation replaced,
in TransformerLens 3.9 as in 4.x. This measures that cost on a saved 4-layer Llama (d_model 128), at the
last block's `hook_resid_post` and at the first block's, with pos=-1 and a 3-output readout, against two
references timed interleaved in the same run, `repeats` times each, keeping the minimum (the machine is shared):
  * forward   one plain forward pass of the bridge over the same token batches;
  * raw jvp   a forward pass to the hook, then torch.func.jvp of the whole bridge with the activation at
              the hook replaced (a written-out version of fit_hook's work, without its plan).
So the ratios can be read across the two versions, whatever the machine's speed.
"""
from __future__ import annotations

import platform
import sys
import tempfile
import time
from importlib.metadata import version

import torch
from torch.func import jvp

from coreinv.ace import ACE
from coreinv.hooks import replace_activation
from coreinv.models import load_local, tiny_local_model


def run(n_layers: int = 4, d_model: int = 128, n_seq: int = 256, n_pos: int = 16, batch_size: int = 64,
        repeats: int = 5) -> list[dict]:
    torch.manual_seed(0)
    folder = tiny_local_model("llama", tempfile.mkdtemp(prefix="coreinv-bench-") + "/llama", n_layers=n_layers,
                              d_model=d_model, n_heads=4)
    model = load_local(folder, device="cpu")
    tokens = torch.randint(0, model.cfg.d_vocab, (n_seq, n_pos), generator=torch.Generator().manual_seed(0))
    batches = list(tokens.split(batch_size))
    readout = lambda logits: logits[:, -1].log_softmax(-1)[:, [5, 6, 7]]        # [batch, 3]

    def forward():
        with torch.no_grad():
            for x in batches: model(x)

    def raw_jvp(hook):
        for x in batches:
            acts = {}
            def keep(a): acts["h"] = a; return a
            with torch.no_grad(), replace_activation(model, hook, keep): model(x)
            h = acts["h"]
            def f(h_):
                with replace_activation(model, hook, lambda a: torch.cat([a[:, :-1], h_[:, -1:]], 1)):
                    return readout(model(x))
            jvp(f, (h,), (torch.randn_like(h),))

    rows = []
    for hook in ("blocks.0.hook_resid_post", f"blocks.{n_layers - 1}.hook_resid_post"):
        fit = lambda: ACE(batch_size=batch_size).fit_hook(model, tokens, hook, readout, pos=-1, progress=False)
        fit(); raw_jvp(hook); forward()                                            # warm-up
        best = {"forward": float("inf"), "raw jvp": float("inf"), "fit_hook": float("inf")}
        for _ in range(repeats):
            for name, fn in (("forward", forward), ("raw jvp", lambda: raw_jvp(hook)), ("fit_hook", fit)):
                t0 = time.perf_counter(); fn(); best[name] = min(best[name], time.perf_counter() - t0)
        rows.append(dict(hook=hook, **best))
    return rows


def main() -> int:
    torch.set_num_threads(1)
    rows = run()
    print(f"transformer-lens {version('transformer-lens')}, torch {torch.__version__}, {platform.machine()}, "
          f"one thread; seconds are the minimum of 5")
    print(f"{'hook':28s} {'forward':>8s} {'raw jvp':>8s} {'fit_hook':>8s}  fit_hook/forward  fit_hook/raw jvp")
    for r in rows:
        print(f"{r['hook']:28s} {r['forward']:8.3f} {r['raw jvp']:8.3f} {r['fit_hook']:8.3f}  "
              f"{r['fit_hook'] / r['forward']:16.2f}  {r['fit_hook'] / r['raw jvp']:16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
