"""The chapters under a second set of CPU float kernels: do their verdicts move with rounding?

PyTorch picks its CPU kernels by instruction set; `ATEN_CPU_CAPABILITY=default|avx2|avx512`, set before
`import torch`, makes one machine run another's (`default`, no vector extensions, and `avx2` exist on every
x86-64 machine). The same code and seeds then round differently: every measured value moves, and chaotic runs
(grokking's loss spikes) train other weights. A verdict should not move; where rounding could decide it, the
chapter's rule must say *undecided*.

This runs each chapter notebook at `--preset` (default `book`) under `ATEN_CPU_CAPABILITY=<capability>` in a
temporary folder and records its claims with the capability the run reports, one file a chapter:
`<out>/<chapter>.json` = {capability: record}. The model cache is one of the regime's own,
`<cache>/regimes/<capability>/` (the cache's keys name the code, not the kernels, so the usual cache would hand
the run this machine's weights); the dequantised pretrained LMs are shared with the usual cache (their bits do not
depend on the kernels: they are read from the GGUF files, not computed). `make publish` runs it under `default`
(`other`) for every chapter, and the scorecard shows the claim x regime table:

    python tools/regimes.py default                          # every chapter of the book -> results/book/regimes/
    python tools/regimes.py other                            # default, or avx2 where this machine's own are default
    python tools/regimes.py default --chapters grokking --preset ci --out /tmp/r --cache /tmp/c

tests/test_kernel_regimes.py runs it for grokking at `ci` with an empty cache and compares its verdicts with those
of the session's own run of the chapter.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = ("markov", "grokking", "agreement", "sae_gap")
CAPABILITY = {"DEFAULT": "default", "AVX2": "avx2", "AVX512": "avx512"}   # get_cpu_capability() -> the env value
LENGTH = {"sae_gap": 1040, "agreement": 667, "markov": 318, "grokking": 172}  # s at book, model cache warm (make publish)


def regime_cache(capability: str) -> Path:
    "The regime's own model cache, the pretrained LMs linked to the usual cache's."
    from coreinv.runtime import cache_dir
    root = cache_dir("regimes", capability)
    root.mkdir(parents=True, exist_ok=True)
    shared, link = cache_dir("pretrained"), root / "pretrained"
    shared.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(shared, target_is_directory=True)
    return root


def other_capability() -> str:
    "The second regime for this machine: `default`, or `avx2` where its own kernels are `default`."
    import torch
    return "avx2" if torch.backends.cpu.get_cpu_capability() == "DEFAULT" else "default"


def run_chapter(chapter: str, capability: str, preset: str, cache: Path) -> dict:
    "Execute `chapter` under `capability` and return its record: machine, provenance, time and claims."
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        nb = tmp / f"{chapter}.ipynb"
        shutil.copy(REPO / "nbs" / "chapters" / f"{chapter}.ipynb", nb)
        env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                            "ATEN_CPU_CAPABILITY": capability, "COREINV_PRESET": preset,
                            "COREINV_RESULTS_DIR": str(tmp / "results"), "COREINV_CACHE": str(cache)}
        t0 = time.time()
        r = subprocess.run([sys.executable, str(REPO / "tools" / "notebooks.py"), "run", str(nb)], env=env)
        if r.returncode:
            sys.exit(f"{chapter} failed under ATEN_CPU_CAPABILITY={capability} (exit {r.returncode})")
        res = json.loads((tmp / "results" / preset / f"{chapter}.json").read_text())
    reported = CAPABILITY.get(res["machine"].get("cpu_capability"))
    if reported != capability:
        sys.exit(f"ATEN_CPU_CAPABILITY={capability} did not take: the run reports {res['machine'].get('cpu_capability')}")
    return {"capability_asked": capability, "preset": preset, "machine": res["machine"],
            "provenance": res["provenance"], "wall_time_s": res["wall_time_s"],
            "run_s": round(time.time() - t0, 1), "claims": res["claims"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("capability", choices=[*sorted(CAPABILITY.values()), "other"])
    ap.add_argument("--chapters", nargs="+", choices=CHAPTERS, default=list(CHAPTERS))
    ap.add_argument("--preset", default="book")
    ap.add_argument("--out", type=Path, help="folder of the records (default: results/<preset>/regimes)")
    ap.add_argument("--cache", type=Path, help="model cache (default: the regime's own, kept between runs)")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                    help="chapters run at a time (default: one per CPU core, each on one thread)")
    a = ap.parse_args(argv)
    from coreinv.results import claim_status
    if a.capability == "other":
        a.capability = other_capability()
    out = a.out or REPO / "results" / a.preset / "regimes"
    out.mkdir(parents=True, exist_ok=True)
    cache = a.cache or regime_cache(a.capability)

    def one(chapter):
        print(f"{chapter} under ATEN_CPU_CAPABILITY={a.capability} at {a.preset}", flush=True)
        record = run_chapter(chapter, a.capability, a.preset, cache)
        path = out / f"{chapter}.json"
        records = json.loads(path.read_text()) if path.is_file() else {}
        records[a.capability] = record
        path.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        lines = [f"  {c['id']:<34} {claim_status(c):<14} {c.get('summary', '')}" for c in record["claims"]]
        print("\n".join([f"{chapter} ({record['run_s']:.0f} s) -> {path}", *lines]), flush=True)

    # chapters side by side, one per core (each kernel on one thread: OMP_NUM_THREADS=1, as `make` sets);
    # the longest first, so that the last to finish is a short one
    order = sorted(a.chapters, key=lambda c: -LENGTH.get(c, 0))
    with ThreadPoolExecutor(max(1, a.workers)) as pool:
        list(pool.map(one, order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
