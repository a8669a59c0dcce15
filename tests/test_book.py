"""Render the committed notebooks into the book, without executing them, from a clean output folder
with warnings as errors, then read the HTML the way a reader would see it."""
import importlib
import json
import re

import pytest
import yaml
from bs4 import BeautifulSoup

from coreinv.results import load_results
from helpers import BIN, REPO, run


def _toc_files():
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part["chapters"]]
    return files


@pytest.fixture(scope="module")
def html(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    config = (REPO / "_config.yml").read_text()
    config = config.replace("execute_notebooks: cache", "execute_notebooks: \"off\"")
    config = config.replace("coreinv_book: _ext", f"coreinv_book: {REPO / '_ext'}")
    assert "execute_notebooks: \"off\"" in config
    (out / "_config.yml").write_text(config)
    r = run([BIN / "jupyter-book", "build", str(REPO), "--config", str(out / "_config.yml"),
             "--path-output", str(out), "-W", "-n", "--keep-going"])
    assert r.returncode == 0, r.stdout[-5000:]
    return out / "_build" / "html"


def _soup(html, page):
    return BeautifulSoup((html / f"{page}.html").read_text(encoding="utf-8"), "html.parser")


def test_index_links_every_page(html):
    assert (html / "index.html").exists()
    start = _soup(html, "intro")
    links = {a.get("href", "").split("#")[0] for a in start.find_all("a")}
    for page in _toc_files():
        assert (html / f"{page}.html").exists(), page
        if page != "intro":
            assert any(l.endswith(f"{page}.html") for l in links), f"intro does not link {page}"


@pytest.mark.parametrize("page", _toc_files())
def test_page_is_clean(html, page):
    soup = _soup(html, page)
    main = soup.find("main") or soup
    text = main.get_text("\n")
    assert not re.search(r"^\s*#\|", text, re.M), f"{page}: an nbdev directive line shows"
    assert "Traceback (most recent call last)" not in text, f"{page}: a traceback shows"
    assert "from nbdev.showdoc import show_doc" not in text, f"{page}: a #| hide cell shows"


def _library_pages():
    for page in _toc_files():
        if not page.startswith("nbs/") or "/chapters/" in page:
            continue
        nb = json.loads((REPO / f"{page}.ipynb").read_text())
        for cell in nb["cells"]:
            m = re.search(r"#\|\s*default_exp\s+(\S+)", "".join(cell["source"]))
            if m:
                yield page, "coreinv." + m.group(1)


@pytest.mark.parametrize("page, module", list(_library_pages()))
def test_library_page_documents_every_public_name(html, page, module):
    text = (_soup(html, page).find("main") or _soup(html, page)).get_text(" ")
    names = [n for n in importlib.import_module(module).__all__
             if callable(getattr(importlib.import_module(module), n))]
    missing = [n for n in names if not re.search(rf"\b{re.escape(n)}\s*\(", text)]
    assert not missing, f"{page}: no signature shown for {missing} (add a show_doc cell)"


@pytest.mark.parametrize("page", [p for p in _toc_files() if "/chapters/" in p])
def test_chapter_shows_figures(html, page):
    imgs = _soup(html, page).find_all("img")
    assert imgs, f"{page}: no figures"
    for img in imgs:
        assert (html / page).parent.joinpath(img["src"]).resolve().exists(), img["src"]


def test_scorecard_lists_every_book_claim(html):
    text = _soup(html, "scorecard").get_text(" ")
    for chapter, res in load_results("book", REPO / "results").items():
        for c in res["claims"]:
            assert c["id"] in text, f"scorecard misses {c['id']}"
