"""The library is in sync with the notebooks: exporting nbs/ afresh reproduces coreinv/ exactly.
The export runs in a copy, so a hand edit under coreinv/ is reported, never overwritten."""
import shutil
from pathlib import Path

from helpers import BIN, REPO, run


def _tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.py"))
            if "__pycache__" not in p.parts}


def test_nbdev_export_changes_nothing(tmp_path):
    for name in ("settings.ini", "pyproject.toml", "setup.py"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "nbs", tmp_path / "nbs", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copytree(REPO / "coreinv", tmp_path / "coreinv", ignore=shutil.ignore_patterns("__pycache__"))
    r = run([BIN / "nbdev_export"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout
    before, after = _tree(REPO / "coreinv"), _tree(tmp_path / "coreinv")
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, (f"nbdev_export changes {changed}: coreinv/ is out of sync with nbs/. "
                         "Edit the notebooks, run .venv/bin/nbdev_export and commit both.")
