"""A look at the book in headless Chromium (Debian's `chromium` package; `.ci/run` installs it).
Both books are looked at: the committed notebooks rendered (`book_html`) and the book executed as
`make book` builds it (`built_book`). Each page must render with ink on it, and formulas must be
typeset by the MathJax that ships with the book (no network here)."""
import shutil

import matplotlib.image as mpimg
import pytest

from helpers import BUILT_LIBRARY_PAGE, BUILT_PAGES, run, toc_files

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
COMMITTED_PAGES = (["intro", "scorecard"] + [p for p in toc_files() if "/chapters/" in p]
                   + [next(p for p in toc_files() if p.startswith("nbs/1"))])
MATH_PAGE = BUILT_LIBRARY_PAGE  # a page with display and inline math
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=15000"]


def _chromium(tmp_path, *args):
    return run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args], timeout=180)


def _looks_rendered(tmp_path, html):
    shot = tmp_path / "shot.png"
    r = _chromium(tmp_path, "--window-size=1280,1600", f"--screenshot={shot}", html.as_uri())
    assert shot.exists(), r.stdout[-2000:]
    img = mpimg.imread(shot)[..., :3]
    ink = (img.mean(axis=-1) < 0.5).mean()  # share of dark pixels: text, figures
    assert 0.005 < ink < 0.5, f"{html}: the screenshot looks blank or broken (dark share {ink:.3f})"


@pytest.mark.parametrize("page", COMMITTED_PAGES)
def test_committed_page_renders(book_html, tmp_path, page):
    _looks_rendered(tmp_path, book_html / f"{page}.html")


@pytest.mark.parametrize("page", BUILT_PAGES)
def test_built_page_renders(built_book, tmp_path, page):
    src, _ = built_book
    _looks_rendered(tmp_path, src / "_build" / "html" / f"{page}.html")


def test_built_math_is_typeset_offline(built_book, tmp_path):
    src, _ = built_book
    r = _chromium(tmp_path, "--dump-dom", (src / "_build" / "html" / f"{MATH_PAGE}.html").as_uri())
    assert "<mjx-container" in r.stdout, "MathJax did not typeset the page's formulas"
