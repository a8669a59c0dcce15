"""The grokking chapter under a second set of CPU float kernels (issue 42, item 4): do its verdicts move with rounding?

PyTorch picks its CPU kernels by instruction set; `ATEN_CPU_CAPABILITY=default|avx2|avx512`, set before
`import torch`, makes one machine run another's. Runs that are chaotic (grokking's loss spikes) train different
weights under different kernels, so the numbers move; a verdict should not. This runs the chapter notebook at
`--preset` (default `book`) under `ATEN_CPU_CAPABILITY=<capability>` in a temporary folder, with an empty model
cache of its own (the checkpoints' keys do not name the kernels, so a shared cache would hand it this machine's
weights), and records each claim's verdict and per-seed values with the capability the run reports:

    python tools/grokking_regimes.py default      # writes results/pilots/grokking_regimes.json (the chapter shows it)

tests/test_kernel_regimes.py runs it at `ci` with `--out` into a temporary file, and compares its verdicts with
those of the session's own run of the chapter.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "results" / "pilots" / "grokking_regimes.json"

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("capability", choices=("default", "avx2", "avx512"))
    ap.add_argument("--preset", default="book")
    ap.add_argument("--out", type=Path, default=OUT, help="the record to add this run to (default: %(default)s)")
    a = ap.parse_args()
    from coreinv.results import claim_status
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        nb = tmp / "grokking.ipynb"
        shutil.copy(REPO / "nbs" / "chapters" / "grokking.ipynb", nb)
        env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                            "ATEN_CPU_CAPABILITY": a.capability, "COREINV_PRESET": a.preset,
                            "COREINV_RESULTS_DIR": str(tmp / "results"), "COREINV_CACHE": str(tmp / "cache")}
        r = subprocess.run([sys.executable, str(REPO / "tools" / "notebooks.py"), "run", str(nb)], env=env)
        if r.returncode:
            sys.exit(f"the chapter failed under ATEN_CPU_CAPABILITY={a.capability} (exit {r.returncode})")
        res = json.loads((tmp / "results" / a.preset / "grokking.json").read_text())
    record = {"capability_asked": a.capability, "preset": a.preset, "machine": res["machine"],
              "provenance": res["provenance"], "wall_time_s": res["wall_time_s"],
              "claims": {c["id"]: {"status": claim_status(c),
                                   **{k: c["measured"][k] for k in ("holds", "share", "wilson95", "tau_grok")
                                      if k in c["measured"]}} for c in res["claims"]}}
    records = json.loads(a.out.read_text()) if a.out.is_file() else {}
    records[a.capability] = record
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for cid, c in record["claims"].items():
        print(f"{cid:<28} {c['status']:<14} {c.get('holds', '')}")
    print("->", a.out)
