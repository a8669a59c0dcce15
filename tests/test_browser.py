"""A look at the built book in headless Chromium, where Chromium is installed (Debian's `chromium`
package); elsewhere these tests are skipped and tests/test_book.py's HTML checks stand alone."""
import shutil

import matplotlib.image as mpimg
import pytest

from helpers import run, toc_files

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
PAGES = ["intro"] + [p for p in toc_files() if "/chapters/" in p][:1]


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_in_a_browser(book_html, tmp_path, page):
    shot = tmp_path / "shot.png"
    r = run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1600",
             f"--screenshot={shot}", (book_html / f"{page}.html").as_uri()], timeout=120)
    assert shot.exists(), r.stdout[-2000:]
    img = mpimg.imread(shot)[..., :3]
    ink = (img.mean(axis=-1) < 0.5).mean()  # share of dark pixels: text, figures
    assert 0.005 < ink < 0.5, f"{page}: the screenshot looks blank or broken (dark share {ink:.3f})"
