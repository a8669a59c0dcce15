"""The project's notebook hygiene policy, and the commands that keep notebooks to it.

Policy (checked by `make test`, through tests/test_notebooks.py):
  * Every notebook in nbs/ is committed *executed*, top to bottom, in one clean run: its code
    cells carry execution counts 1, 2, 3, ... in order, so nbval can re-run them and the book
    and any notebook viewer show real outputs. Chapters carry the outputs of their `book` run.
    Cells tagged `gpu` may be unexecuted (no count, no outputs) when that run had no GPU.
  * No error outputs.
  * Chapter code lines are at most CHAPTER_CODE_WIDTH (79) characters: wider lines scroll sideways
    in the book's code blocks.
  * Metadata is cleaned: the notebook keeps only `kernelspec` (python3) and `language_info.name`;
    cells keep only their `tags`. Timing, widget state, trust signatures and editor state go.
  * We never use `nbdev_clean`: it nulls execution counts, and nbval then fails stored outputs.

Commands:
  python tools/notebooks.py check [NB ...]      report policy breaches (exit 1 if any)
  python tools/notebooks.py fix [NB ...]        clean metadata in place (outputs and counts kept)
  python tools/notebooks.py run NB [NB ...]     execute in place at $COREINV_PRESET, then fix
  python tools/notebooks.py publish --cache DIR --results DIR
                                                copy a `make book` run's outputs into nbs/ and
                                                its results into results/book/
  python tools/notebooks.py build [--preset P] [--results DIR] [--toc F] [--path-output DIR] [--workers N]
                                                build the book, executing what changed (what
                                                `make book` runs), N notebooks at a time (default:
                                                one per core); then print each chapter's claims

The notebook rules shared with the book (GPU cells, progress bars) have one home, the book's Sphinx
extension `_ext/coreinv_book.py`; this file imports its public functions.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "_ext"))  # the book's extension: the home of the shared notebook rules
from coreinv_book import KERNEL_ENV, SKIP_TAG, WORKERS_ENV, coalesce_streams, mark_gpu_cells  # noqa: E402
from coreinv_kernels import AsyncUnixSocketKernelManager  # noqa: E402

from coreinv.presets import is_gpu_cell  # noqa: E402

MAX_BYTES = 6_000_000
CHAPTER_CODE_WIDTH = 79  # what the book's code block shows without scrolling
_NB_META_KEEP = {"kernelspec", "language_info"}


def notebooks(paths=()) -> list[Path]:
    if paths:
        return [Path(p) for p in paths]
    return sorted(p for p in (REPO / "nbs").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def problems(path: Path) -> list[str]:
    "Every breach of the policy in one notebook, as readable sentences."
    out = []
    raw = path.read_bytes()
    if len(raw) > MAX_BYTES:
        out.append(f"is {len(raw) / 1e6:.1f} MB (limit {MAX_BYTES / 1e6:.0f} MB): shrink figures or outputs")
    nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        out.append(f"is not valid nbformat: {e.message}")
    extra = set(nb.metadata) - _NB_META_KEEP
    if extra:
        out.append(f"has notebook metadata {sorted(extra)} (run tools/notebooks.py fix)")
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        out.append("kernelspec is not python3")
    if set(nb.metadata.get("language_info", {})) - {"name"}:
        out.append("language_info has more than its name (run tools/notebooks.py fix)")
    expected = 1
    for i, cell in enumerate(nb.cells, start=1):
        where = f"cell {i}"
        if set(cell.metadata) - {"tags"}:
            out.append(f"{where} has metadata {sorted(set(cell.metadata) - {'tags'})} (run fix)")
        if cell.cell_type != "code":
            continue
        if "chapters" in path.parts:
            wide = [n for n, line in enumerate(cell.source.splitlines(), 1) if len(line) > CHAPTER_CODE_WIDTH]
            if wide:
                out.append(f"{where} has code lines wider than {CHAPTER_CODE_WIDTH} characters "
                           f"(lines {wide}): wrap them, they scroll sideways in the book")
        count = cell.get("execution_count")
        if any(o.get("output_type") == "error" for o in cell.outputs):
            out.append(f"{where} has an error output")
        if count is None:
            if cell.outputs:
                out.append(f"{where} has outputs but no execution count (nbval fails such cells)")
            if not is_gpu_cell(cell) and cell.source.strip():
                out.append(f"{where} was not executed: commit notebooks after a clean top-to-bottom run")
            continue
        if count != expected:
            out.append(f"{where} has execution count {count}, expected {expected}: "
                       "re-run the notebook top to bottom (tools/notebooks.py run)")
            expected = count
        expected += 1
    return out


def fix(path: Path) -> bool:
    "Clean metadata in place; return True if the file changed."
    before = path.read_text(encoding="utf-8")
    nb = nbformat.reads(before, as_version=4)
    nb.metadata = nbformat.NotebookNode(
        {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
         "language_info": {"name": "python"}})
    for cell in nb.cells:
        tags = cell.metadata.get("tags")
        cell.metadata = nbformat.NotebookNode({"tags": tags} if tags else {})
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.outputs)
    after = nbformat.writes(nb) + "\n"
    if after != before:
        path.write_text(after, encoding="utf-8")
    return after != before


def run(path: Path, timeout: int = 3600) -> None:
    "Execute a notebook in place from a fresh kernel, as the book does (`gpu` cells skipped without a GPU)."
    from nbclient import NotebookClient
    nb = mark_gpu_cells(nbformat.read(path, as_version=4))
    for cell in nb.cells:  # start clean: a skipped gpu cell must not keep stale outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    os.environ.update(KERNEL_ENV)  # the kernel inherits it: figures go into the notebook, one thread, as in the book
    NotebookClient(nb, timeout=timeout, kernel_name="python3", kernel_manager_class=AsyncUnixSocketKernelManager,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:  # the skip tag is the executor's business, not the notebook's
        tags = cell.metadata.get("tags", [])
        if is_gpu_cell(cell) and SKIP_TAG in tags:
            tags.remove(SKIP_TAG)
    nbformat.write(nb, path)
    fix(path)



def publish(cache: Path, results: Path) -> None:
    "Merge the outputs a `make book` run cached into nbs/, and copy its results (answer figures, regimes) to results/book/."
    from jupyter_cache import get_cache
    jc = get_cache(cache)
    for path in notebooks():
        nb = nbformat.read(path, as_version=4)
        had_skip = [SKIP_TAG in c.get("metadata", {}).get("tags", []) for c in nb.cells]
        try:   # the cache holds the notebook as the book read it: `gpu` cells tagged to skip
            _, merged = jc.merge_match_into_notebook(mark_gpu_cells(nb))
        except KeyError:
            print(f"skip {path.relative_to(REPO)}: not in the book's cache (not in _toc.yml?)")
            continue
        for cell, had in zip(merged.cells, had_skip):   # the skip tag is the book's, not the notebook's
            if not had and SKIP_TAG in cell.get("metadata", {}).get("tags", []):
                cell.metadata["tags"] = [t for t in cell.metadata["tags"] if t != SKIP_TAG]
        nbformat.write(merged, path)
        fix(path)
        print(f"outputs  {path.relative_to(REPO)}")
    dest = REPO / "results" / "book"
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted([*Path(results).glob("*.json"), *Path(results).glob("*.png"),  # claims, answer figures,
                     *Path(results).glob("regimes/*.json")]):                      # claims under other kernels
        to = dest / f.relative_to(results)
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, to)
        print(f"results  {to.relative_to(REPO)}")


def chapters_in_toc(toc: Path) -> list[str]:
    "The chapter notebooks (under nbs/chapters/) that a table of contents names, by results name."
    import yaml
    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    files = [c["file"] for part in data.get("parts") or [] for c in part.get("chapters") or []]
    return [Path(f).name for f in files if "chapters/" in f]


def build(preset: str = "book", results: Path | None = None, toc: Path | None = None,
          path_output: Path | None = None, source: Path = REPO, workers: int | None = None) -> int:
    """Build the book from `source` with Jupyter Book, executing notebooks whose code changed, at
    `preset`, `workers` at a time (default `$COREINV_BOOK_WORKERS`, else one per core: see
    `_ext/coreinv_book.py`); results go to `results` (default `_build/results`). Then print each
    chapter's claims and the index page. Returns 1 if a notebook failed to execute or a chapter of
    the table of contents has no results from the current code."""
    from coreinv.results import chapter_summaries, provenance, stale_results
    out = Path(path_output or source)
    results = Path(results or out / "_build" / "results")
    toc = Path(toc or source / "_toc.yml")
    env = {**os.environ, "COREINV_PRESET": preset, "COREINV_RESULTS_DIR": str(results)}
    if workers is not None:
        env[WORKERS_ENV] = str(workers)
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(source), "--keep-going",
           "--toc", str(toc), "--path-output", str(out)]
    t0 = time.time()
    code = subprocess.run(cmd, env=env).returncode
    html = out / "_build" / "html"
    failed = sorted((html / "reports").glob("**/*.log")) if (html / "reports").exists() else []
    fresh = [f for f in failed if f.stat().st_mtime >= t0]
    key = provenance()["key"]
    summaries = {s["chapter"]: s for s in chapter_summaries(preset, results)}
    print(f"\nbook ({preset} preset, code {key}), built in {time.time() - t0:.0f} s:")
    bad = code != 0 or bool(fresh)
    chapters = chapters_in_toc(toc)
    stale = dict(stale_results(preset, results, chapters=chapters, source=source, environment=True))
    for chapter in chapters:
        s = summaries.get(chapter)
        if chapter in stale:
            print(f"  {chapter:<10} not current: {stale[chapter]}")
            bad = True
        else:
            failed_req = f"; REQUIRED FAILED: {', '.join(s['failed_required'])}" if s["failed_required"] else ""
            untestable = f", {s['untestable']} not testable" if s["untestable"] else ""
            print(f"  {chapter:<10} {s['held']} of {s['total']} claims hold{untestable} "
                  f"({s['wall_time_s']:.0f} s){failed_req}")
    for f in fresh:
        print(f"  execution failed, see {f.relative_to(out)}")
    print(f"book: {html / 'index.html'}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("check", "fix", "run"):
        p = sub.add_parser(name)
        p.add_argument("paths", nargs="*")
    p = sub.add_parser("build")
    p.add_argument("--preset", default=os.environ.get("COREINV_PRESET", "book"))
    p.add_argument("--results", type=Path)
    p.add_argument("--toc", type=Path)
    p.add_argument("--path-output", type=Path)
    p.add_argument("--workers", type=int, help="notebooks executed at a time (default: one per core)")
    p = sub.add_parser("publish")
    p.add_argument("--cache", type=Path, required=True)
    p.add_argument("--results", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "check":
        bad = {p: problems(p) for p in notebooks(a.paths)}
        for p, msgs in bad.items():
            for m in msgs:
                print(f"{p}: {m}")
        return 1 if any(bad.values()) else 0
    if a.cmd == "fix":
        for p in notebooks(a.paths):
            if fix(p):
                print(f"fixed {p}")
    elif a.cmd == "run":
        for p in notebooks(a.paths):
            print(f"running {p}", flush=True)
            run(p)
    elif a.cmd == "build":
        return build(a.preset, a.results, a.toc, a.path_output, workers=a.workers)
    elif a.cmd == "publish":
        publish(a.cache, a.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
