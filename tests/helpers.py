"""Small shared pieces for the tests (paths, running a command, building a notebook)."""
import os
import subprocess
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(cmd, cwd=REPO, env=None, timeout=900):
    "Run a command; return the CompletedProcess with stdout+stderr merged into .stdout."
    full_env = {**os.environ, "MPLBACKEND": "Agg", **(env or {})}
    return subprocess.run(cmd, cwd=cwd, env=full_env, timeout=timeout, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def make_notebook(path: Path, cells) -> Path:
    "Write a notebook from (kind, source, tags) triples."
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    for kind, source, tags in cells:
        new = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
        cell = new(source)
        if tags:
            cell.metadata["tags"] = list(tags)
        nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


def toc_files() -> list[str]:
    "Every page of the book, in _toc.yml order (paths without suffix)."
    import yaml
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part["chapters"]]
    return files
