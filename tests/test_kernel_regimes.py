"""Issue 42, item 4: the grokking chapter's verdicts do not depend on the CPU's float kernels.

PyTorch picks its CPU kernels by instruction set, and `ATEN_CPU_CAPABILITY` (set before `import torch`) makes
one machine run another's: `default` (no vector extensions) and `avx2` exist on every x86-64 machine. Grokking
is chaotic (its loss spikes), so the numbers move between regimes; a verdict must not. Where rounding could
decide it, the chapter's rules must say *undecided* (`coreinv.verdicts.share_verdict`), not holds or fails.

The first regime is this session's nbval run of the chapter at `ci` (the machine's own kernels, recorded in
its results' `machine`); the second is `tools/regimes.py` for this chapter at `ci` under `default`, or under
`avx2` when the first ran `default`, with an empty model cache of its own. (`make publish` runs every chapter at
`book` under `default` with the same tool; the scorecard shows that table.) Only verdicts are compared. At `ci` the
chapter trains one seed, so its per-seed claims are undecided by the share rule under any kernels (one seed
cannot put a Wilson interval on either side of 1/2); what can move here is `groks` (every seed), `inflation`'s
testability and the scaling sweep's `alpha` and `beta`. The `book` run's table is in the chapter.
"""
import json
import os
import shutil
import sys

import pytest

from coreinv.results import claim_status
from helpers import REPO, run

CHAPTER = "grokking"
CAPABILITY = {"DEFAULT": "default", "AVX2": "avx2", "AVX512": "avx512"}   # get_cpu_capability() -> the env value


@pytest.fixture(scope="module")
def regime_runs(tmp_path_factory, nbval_chapter):
    "{capability: {claim id: status}} for the two regimes."
    tmp = tmp_path_factory.mktemp("regimes")
    first = nbval_chapter(CHAPTER)
    if first is not None:
        res = json.loads((first.results / "ci" / f"{CHAPTER}.json").read_text())
    else:   # the session did not run the chapter: run it here under this machine's kernels
        r = run([sys.executable, str(REPO / "tools" / "notebooks.py"), "run", str(_copy(tmp))],
                env={"COREINV_PRESET": "ci", "COREINV_RESULTS_DIR": str(tmp / "results"),
                     "COREINV_CACHE": str(tmp / "cache"), "PYTHONPATH": _pythonpath()}, timeout=3600)
        assert r.returncode == 0, r.stdout[-4000:]
        res = json.loads((tmp / "results" / "ci" / f"{CHAPTER}.json").read_text())
    native = CAPABILITY[res["machine"]["cpu_capability"]]
    other = "avx2" if native == "default" else "default"
    r = run([sys.executable, str(REPO / "tools" / "regimes.py"), other, "--chapters", CHAPTER, "--preset", "ci",
             "--out", str(tmp / "regimes"), "--cache", str(tmp / "regime-cache")],
            env={"PYTHONPATH": _pythonpath()}, timeout=3600)
    assert r.returncode == 0, r.stdout[-4000:]
    second = json.loads((tmp / "regimes" / f"{CHAPTER}.json").read_text())[other]
    assert CAPABILITY[second["machine"]["cpu_capability"]] == other, \
        f"ATEN_CPU_CAPABILITY={other} did not take: the run reports {second['machine']['cpu_capability']}"
    return {native: {c["id"]: claim_status(c) for c in res["claims"]},
            other: {c["id"]: claim_status(c) for c in second["claims"]}}


def _copy(tmp):
    nb = tmp / f"{CHAPTER}.ipynb"
    shutil.copy(REPO / "nbs" / "chapters" / f"{CHAPTER}.ipynb", nb)
    return nb


def _pythonpath() -> str:
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def test_grokking_verdicts_do_not_move_with_the_float_kernels(regime_runs):
    (a, va), (b, vb) = regime_runs.items()
    assert set(va) == set(vb), f"the claims differ: {sorted(set(va) ^ set(vb))}"
    moved = {cid: (va[cid], vb[cid]) for cid in va if va[cid] != vb[cid]}
    assert not moved, f"verdicts that moved between ATEN_CPU_CAPABILITY={a} and {b} (a verdict that flips with " \
                      f"rounding must come out undecided): {moved}"
