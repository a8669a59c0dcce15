"""A look at the book in headless Chromium (Debian's `chromium` package; `.ci/run` installs it).
Both books are looked at: the committed notebooks rendered (`book_html`) and the book executed as
`make book` builds it (`built_book`). Each page must render with ink on it, and formulas must be
typeset by the MathJax that ships with the book (no network here)."""
import json
import re
import shutil
from html import unescape

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


# The reading test: a chapter as a reader meets it on a 1280 x 800 screen. A script added to a copy of the
# page measures the layout after it loads and writes what it found into the page, which --dump-dom prints.
SCREEN = 800
_MEASURE = """<script>
window.addEventListener("load", () => {
  const main = document.querySelector("article.bd-article") || document.querySelector("main");
  const m = main.getBoundingClientRect();
  const box = e => { const r = e.getBoundingClientRect(); return {top: r.top - m.top, bottom: r.bottom - m.top}; };
  const seen = e => e.offsetParent !== null && !e.closest("details:not([open])") && e.getBoundingClientRect().width > 0;
  const table = document.querySelector("div.verdicts table");
  const figure = [...main.querySelectorAll("figure img, div.cell_output img")].find(seen);
  const wide = [...main.querySelectorAll("*")].filter(seen).filter(e => {
    const r = e.getBoundingClientRect(), s = getComputedStyle(e);
    const scrolls = /(auto|scroll)/.test(s.overflowX) && e.scrollWidth > e.clientWidth + 1;
    return r.right > m.right + 1 || scrolls;
  }).map(e => e.tagName + "." + (e.className || "") + ": " + (e.textContent || e.src || "").trim().slice(0, 80));
  const out = {width: m.width, top: m.top, table: table && box(table), figure: figure && box(figure), wide: wide.slice(0, 5)};
  const pre = document.createElement("pre"); pre.id = "coreinv-reading"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _reading(tmp_path, html):
    "The layout of `html` at 1280 x 800, measured in Chromium: the verdict table's and first figure's boxes, wide elements."
    probe = html.with_name(html.stem + ".reading.html")   # beside the page, so its links and images resolve
    probe.write_text(html.read_text(encoding="utf-8").replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    r = _chromium(tmp_path, "--window-size=1280,800", "--dump-dom", probe.as_uri())
    m = re.search(r'<pre id="coreinv-reading"[^>]*>(.*?)</pre>', r.stdout, re.S)
    assert m, f"{html}: the measuring script did not run: {r.stdout[-1000:]}"
    return json.loads(unescape(m.group(1)))


@pytest.mark.parametrize("page", [p for p in toc_files() if "/chapters/" in p])
def test_chapter_answer_is_on_the_first_screen(book_html, tmp_path, page):
    """A chapter's first 800 px (of its main column) hold its verdict table and a figure, and no element of the
    page that shows is wider than the column (a reader would have to scroll sideways); folded content, a click
    away, is measured when unfolded by `test_page_is_clean`'s line rule, not here."""
    m = _reading(tmp_path, book_html / f"{page}.html")
    assert m["table"], f"{page}: no verdict table (a `verdicts` container with a table)"
    assert m["table"]["bottom"] <= SCREEN, f"{page}: the verdict table ends at {m['table']['bottom']:.0f} px"
    assert m["figure"], f"{page}: no figure"
    assert m["figure"]["bottom"] <= SCREEN, f"{page}: the first figure ends at {m['figure']['bottom']:.0f} px"
    assert not m["wide"], f"{page}: wider than the {m['width']:.0f}-px column: {m['wide']}"
