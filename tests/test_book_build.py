"""The book as `make book` builds it. `tests/test_book.py` renders the committed notebooks without
executing them; this file executes them, through the same command as `make book`
(`tools/notebooks.py build`: the repository's `_config.yml`, its Sphinx extension, the same
environment), at the `ci` preset, over a copy of the repository with a short table of contents:
the introduction, one library page, the smallest chapter (Markov) and the scorecard.
`MPLBACKEND=Agg` is exported on purpose, as the Makefile does: the figures must still be there.

In a full `make test` the chapter was already executed once, by nbval at `ci` (root conftest.py): the
first build reads it from the book's cache, as a second `make book` would, and executes the library
page only. Then the code changes, as a user who edits the library would change it: one exported cell
of the task module that the chapter calls. The next build must re-execute the chapter (this is where
the book's own executor runs it, figures and all), and its results must name the new code."""
import json
import os
import re
import subprocess

import pytest
from bs4 import BeautifulSoup

from helpers import BIN, BUILT_CHAPTER as CHAPTER, BUILT_PAGES as PAGES, REPO, build_copy, forbidden_hit, outputs_text, run

def _results(src):
    return json.loads((src / "_build" / "results" / "ci" / "markov.json").read_text())


def _page(src, page):
    return BeautifulSoup((src / "_build" / "html" / f"{page}.html").read_text(encoding="utf-8"), "html.parser")


def test_build_ends_with_the_claims_and_the_index(built_book):
    src, out = built_book
    tail = out[out.rindex("book (ci preset"):]
    assert re.search(r"markov\s+\d+ of \d+ claims hold", tail), tail
    assert f"book: {src / '_build' / 'html' / 'index.html'}" in tail


@pytest.mark.parametrize("page", PAGES)
def test_page_has_no_tool_noise_or_machine_paths(built_book, page):
    src, _ = built_book
    main = _page(src, page).find("main")
    hit = forbidden_hit(outputs_text(main), extra=[re.escape(str(src)), re.escape(str(REPO))])
    assert hit is None, f"{page}: {hit}"


def test_chapter_figures_are_drawn(built_book):
    _assert_figures_drawn(built_book[0])


def _assert_figures_drawn(src):
    nb = json.loads((src / f"{CHAPTER}.ipynb").read_text())
    n_show = sum("plt.show()" in "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    imgs = _page(src, CHAPTER).find("main").find_all("img")
    assert len(imgs) >= n_show > 0, f"{len(imgs)} figures for {n_show} plt.show() cells"
    for img in imgs:
        assert (src / "_build" / "html" / CHAPTER).parent.joinpath(img["src"]).resolve().is_file(), img["src"]


def test_progress_bars_show_their_final_state_only(built_book):
    src, _ = built_book
    text = _page(src, CHAPTER).find("main").get_text("\n")
    # a tqdm line: "desc: 40%|████| 4/10 [00:01<00:02, ...]" or, without a total, "desc: 7it [00:00, ...]"
    bars = re.findall(r"^\s*([^\n:|]{1,40}):\s.*\[\d+:\d\d[<,]", text, re.M)
    assert bars, "the chapter shows progress bars"
    assert len(bars) == len(set(bars)), f"a progress bar shows more than once: {bars}"


@pytest.mark.parametrize("page", PAGES)
def test_math_loads_from_the_book_itself(built_book, page):
    src, _ = built_book
    for script in _page(src, page).find_all("script", src=True):
        assert not (re.match(r"(https?:)?//", script["src"]) and "mathjax" in script["src"].lower()), script
    assert (src / "_build" / "html" / "_static" / "mathjax" / "tex-chtml.js").is_file()


def test_scorecard_shows_the_code_that_wrote_the_results(built_book):
    src, _ = built_book
    res = _results(src)
    text = _page(src, "scorecard").find("main").get_text(" ")
    assert res["provenance"]["key"] in text
    # and the machine: the instruction set PyTorch's CPU kernels used, which a seed's numbers depend on
    assert res["machine"]["cpu_capability"] and f"{res['machine']['arch']}, {res['machine']['cpu_capability']}" in text


def _edit_library(src, notebook: str, module: str) -> None:
    "Add a line of code to an exported cell of `nbs/<notebook>.ipynb` and export it to `coreinv/<module>`."
    path = src / "nbs" / f"{notebook}.ipynb"
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).startswith("#| export")
                and "def " in "".join(c["source"]))
    cell["source"] = "".join(cell["source"]) + "\n_EDITED = 1  # an edit to the library's code\n"
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    assert run([BIN / "nbdev_export"], cwd=src).returncode == 0
    assert "_EDITED = 1" in (src / "coreinv" / module).read_text()


def test_a_library_change_re_executes_the_chapter(built_book):
    src, _ = built_book
    before = _results(src)
    again = build_copy(src)  # nothing changed: served from the cache, results untouched
    assert again.returncode == 0, again.stdout[-4000:]
    assert _results(src)["written"] == before["written"]

    # code the chapter does not import (the agreement language): its cached run stays, other pages re-run
    _edit_library(src, "23_agreement_language", "tasks/agreement/language.py")
    r = build_copy(src)
    assert r.returncode == 0, r.stdout[-6000:]
    assert _results(src)["written"] == before["written"], "a chapter re-ran for code it does not import"
    assert "re-executed (" in r.stdout, "the library page keyed on the whole package was not re-executed"

    _edit_library(src, "21_tasks_markov", "tasks/markov/__init__.py")  # code the chapter calls
    r = build_copy(src)
    assert r.returncode == 0, r.stdout[-6000:]
    after = _results(src)
    assert after["provenance"]["library"] != before["provenance"]["library"], "the chapter was not re-executed"
    assert after["written"] != before["written"]
    key = subprocess.run([BIN / "python", "-c", f"from coreinv.results import provenance; print(provenance({CHAPTER.rsplit('/', 1)[-1]!r})['key'])"],
                         cwd=src, env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True).stdout.strip()
    assert after["provenance"]["key"] == key, "the results name the new code"
    assert key in _page(src, "scorecard").find("main").get_text(" ")
    _assert_figures_drawn(src)  # by the book's executor this time
