"""Small shared pieces for the tests (paths, running a command, building a notebook)."""
import os
import re
import shutil
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


# Prepended to the scripts `hashes_in_fresh_process` runs: a hash of a model's weights (and more bytes).
_STATE_HASH = """import hashlib, sys
def state_hash(model, *extra: bytes) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode()); h.update(t.detach().cpu().contiguous().numpy().tobytes())
    for x in extra:
        h.update(x)
    return h.hexdigest()
"""


def hashes_in_fresh_process(scripts: dict[str, str], seeds) -> dict[str, list[str]]:
    """In one new Python process on this checkout's coreinv, for each seed in order, run each script of `scripts`
    (name: code that trains with the integer `seed` and prints `state_hash(...)`); return each script's hashes, in
    the order of `seeds` (for determinism across processes: two calls with the seeds, and the scripts, in opposite
    orders show that a run depends on its seed alone, not on the process nor on what ran before it there)."""
    prog = _STATE_HASH + f"SCRIPTS = {scripts!r}\nfor seed in map(int, sys.argv[1:]):\n" \
        "    for name, code in SCRIPTS.items():\n" \
        "        exec(code, {'seed': seed, 'state_hash': state_hash, 'sys': sys})\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"),
                                                                     os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", prog, *map(str, seeds)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()[-len(seeds) * len(scripts):]
    assert len(lines) == len(seeds) * len(scripts) and all(len(h) == 64 for h in lines), r.stdout[-3000:]
    return {name: lines[i::len(scripts)] for i, name in enumerate(scripts)}


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


# The book that `make book` builds, executed at the `ci` preset over a copy of the repository with a
# short table of contents (see tests/test_book_build.py).
BUILT_LIBRARY_PAGE, BUILT_CHAPTER = "nbs/10_ace", "nbs/chapters/markov"
BUILT_PAGES = ["intro", BUILT_LIBRARY_PAGE, BUILT_CHAPTER, "scorecard"]
BUILT_TOC = f"""format: jb-book
root: intro
parts:
  - caption: Chapters
    chapters:
      - file: {BUILT_CHAPTER}
  - caption: Results
    chapters:
      - file: scorecard
  - caption: Library
    chapters:
      - file: {BUILT_LIBRARY_PAGE}
"""


# What must never reach a page: tool warnings as Python prints them (`file.py:12: XWarning`),
# machine paths, tracebacks, in what cells print. A page that shows a warning on purpose prints its message.
FORBIDDEN = [r"IProgress", r"\.py:\d+: \w*Warning\b", r"Traceback \(most recent call last\)",
             r"site-packages", r"/\.venv/", r"(?<![\w.])/(?:root|home|tmp|work|usr)/"]


def forbidden_hit(text: str, extra=()) -> str | None:
    "The first FORBIDDEN (or `extra`) pattern in `text`, with its context, else None."
    for pattern in [*FORBIDDEN, *extra]:
        hit = re.search(pattern, text)
        if hit:
            return f"{pattern!r} shows: …{text[max(0, hit.start() - 200):hit.end() + 200]}…"
    return None


def outputs_text(soup) -> str:
    "The text of every cell output on a page (what the code printed or displayed, not the code)."
    return "\n".join(o.get_text("\n") for o in soup.select("div.cell_output"))


def copy_repo(dest: Path) -> Path:
    "Copy the repository's tracked and new (not ignored) files into `dest`, as a fresh clone would hold them."
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, text=True,
                           capture_output=True, check=True).stdout.splitlines()
    for f in files:
        if (REPO / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dest / f)
    return dest


def build_copy(src: Path):
    "Build the book in a repository copy exactly as `make book` does, at `ci`, with BUILT_TOC."
    (src / "_toc_test.yml").write_text(BUILT_TOC)
    # PYTHONPATH: the kernels and the extension import the copy's coreinv, not the repo's.
    # MPLBACKEND=Agg, as the Makefile exports it: the build must draw figures all the same.
    return run([BIN / "python", "tools/notebooks.py", "build", "--preset", "ci", "--toc", "_toc_test.yml"],
               cwd=src, env={"PYTHONPATH": str(src), "MPLBACKEND": "Agg"}, timeout=1800)


def seed_build(src: Path, page: str, run) -> None:
    """Give the repository copy `src` a chapter executed elsewhere, as if its `make book` had executed it:
    `run` (a `ChapterRun` of root conftest.py: this session's nbval run) goes into the book's notebook
    cache, under the current code key, and its results into `_build/results`. The copy's first build then
    reads the chapter from the cache instead of executing it again."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    sys.path.insert(0, str(REPO / "_ext"))
    from coreinv_book import read_notebook, write_keys
    path = src / f"{page}.ipynb"
    nb = read_notebook(path.read_text(encoding="utf-8"))  # as the book reads it (gpu cells tagged to skip)
    assert len(nb.cells) == len(run.notebook.cells), f"{page} is not the notebook nbval ran"
    for cell, done in zip(nb.cells, run.notebook.cells):
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = done.outputs, done.execution_count
    cache = src / "_build" / ".jupyter_cache"
    get_cache(cache).cache_notebook_bundle(CacheBundleIn(nb, str(path)), check_validity=False, overwrite=True)
    write_keys(cache)  # else the build drops the notebook as stale
    name = Path(page).name
    dest = src / "_build" / "results" / "ci"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(run.results / "ci" / f"{name}.json", dest / f"{name}.json")


def toc_files() -> list[str]:
    "Every page of the book, in _toc.yml order, sections after their parent (paths without suffix)."
    import yaml
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())

    def walk(entries):
        for e in entries:
            yield e["file"]
            yield from walk(e.get("sections", []))
    return [toc["root"]] + [f for part in toc.get("parts", []) for f in walk(part["chapters"])]


class LazyModels(dict):
    """`models[arch, route]`, loaded by `load(folder, route)` when first read: under TransformerLens 4 a test
    that reads only the bridge route runs, and one that reads the hooked route stops (skipped) where it does."""

    def __init__(self, load, folders):
        super().__init__()
        self.load, self.folders = load, folders

    def __missing__(self, key):
        arch, route = key
        self[key] = self.load(self.folders[arch], route)
        return self[key]
