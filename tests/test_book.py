"""Render the committed notebooks into the book, without executing them, from a clean output folder
with warnings as errors, then read the HTML the way a reader would see it."""
import importlib
import json
import re

import pytest
from bs4 import BeautifulSoup

from coreinv.results import load_results
from helpers import REPO, forbidden_hit, outputs_text, toc_files


def _soup(book_html, page):
    return BeautifulSoup((book_html / f"{page}.html").read_text(encoding="utf-8"), "html.parser")


def test_index_links_every_page(book_html):
    assert (book_html / "index.html").exists()
    start = _soup(book_html, "intro")
    links = {a.get("href", "").split("#")[0] for a in start.find_all("a")}
    for page in toc_files():
        assert (book_html / f"{page}.html").exists(), page
        if page != "intro":
            assert any(l.endswith(f"{page}.html") for l in links), f"intro does not link {page}"


@pytest.mark.parametrize("page", toc_files())
def test_page_is_clean(book_html, page):
    soup = _soup(book_html, page)
    main = soup.find("main") or soup
    text = main.get_text("\n")
    assert not re.search(r"^\s*#\|", text, re.M), f"{page}: an nbdev directive line shows"
    assert "Traceback (most recent call last)" not in text, f"{page}: a traceback shows"
    assert "from nbdev.showdoc import show_doc" not in text, f"{page}: a #| hide cell shows"
    hit = forbidden_hit(outputs_text(main), extra=[re.escape(str(REPO))])
    assert hit is None, f"{page}: {hit}"
    # the project's history stays out of the book: a reader has no issue tracker
    tracker = re.search(r"\bissues?\s*#?\d+|\(#\d+\)", text, re.I)
    assert tracker is None, f"{page}: an issue number shows: {text[max(0, tracker.start() - 60):tracker.end()]!r}"
    # a Markdown table that an output displays renders as a table, not as lines of pipes (CommonMark,
    # myst-nb's default for outputs, has no tables: _config.yml sets GFM)
    pipes = [p.get_text()[:60] for p in main.find_all("p")
             if re.match(r"\s*\|.*\|\s*$", p.get_text().split("\n")[0])]
    assert not pipes, f"{page}: a Markdown table shows as text: {pipes[0]!r}"


def _library_pages():
    for page in toc_files():
        if not page.startswith("nbs/") or "/chapters/" in page or not (REPO / f"{page}.ipynb").is_file():
            continue   # chapters, and the Markdown pages (method notes, the reference's group pages)
        nb = json.loads((REPO / f"{page}.ipynb").read_text())
        for cell in nb["cells"]:
            m = re.search(r"#\|\s*default_exp\s+(\S+)", "".join(cell["source"]))
            if m:
                yield page, "coreinv" if m.group(1) == "__init__" else "coreinv." + m.group(1)


@pytest.mark.parametrize("page, module", list(_library_pages()))
def test_library_page_documents_every_public_name(book_html, page, module):
    "Each public function and class has its show_doc entry: a heading with its name, then its signature."
    soup = _soup(book_html, page)
    headings = {h.get_text(" ").strip().rstrip("#¶ ").strip() for h in soup.find_all(["h2", "h3", "h4"])}
    mod = importlib.import_module(module)
    names = [n for n in mod.__all__ if callable(getattr(mod, n))]
    missing = [n for n in names if n not in headings]
    assert not missing, f"{page}: no show_doc entry for {missing}"


@pytest.mark.parametrize("page", [p for p in toc_files() if "/chapters/" in p])
def test_chapter_shows_figures(book_html, page):
    imgs = _soup(book_html, page).find_all("img")
    assert imgs, f"{page}: no figures"
    for img in imgs:
        assert (book_html / page).parent.joinpath(img["src"]).resolve().exists(), img["src"]


def test_scorecard_lists_every_book_claim(book_html):
    text = _soup(book_html, "scorecard").get_text(" ")
    for chapter, res in load_results("book", REPO / "results").items():
        for c in res["claims"]:
            assert c["id"] in text, f"scorecard misses {c['id']}"
