import pytest

from helpers import BIN, BUILT_CHAPTER, REPO, build_copy, copy_repo, run, seed_build


@pytest.fixture(scope="session")
def book_html(tmp_path_factory):
    """The book rendered from the committed notebooks, without executing them, into a clean
    folder, with warnings as errors (`-W -n --keep-going`); returns the HTML folder."""
    out = tmp_path_factory.mktemp("book")
    config = (REPO / "_config.yml").read_text()
    config = config.replace("execute_notebooks: cache", "execute_notebooks: \"off\"")
    config = config.replace("coreinv_book: _ext", f"coreinv_book: {REPO / '_ext'}")
    assert "execute_notebooks: \"off\"" in config and str(REPO / "_ext") in config
    (out / "_config.yml").write_text(config)
    # The committed notebooks carry the `book` run's outputs, so the scorecard shows that preset.
    r = run([BIN / "jupyter-book", "build", str(REPO), "--config", str(out / "_config.yml"),
             "--path-output", str(out), "-W", "-n", "--keep-going"], env={"COREINV_PRESET": "book"})
    assert r.returncode == 0, r.stdout[-5000:]
    return out / "_build" / "html"


@pytest.fixture(scope="session")
def built_book(tmp_path_factory, nbval_chapter):
    """The book as `make book` builds it (executed), at the `ci` preset, in a copy of the repository
    with a short table of contents; returns (the copy's folder, the build's output). The chapter comes
    from this session's nbval run of it when there is one (`nbval_chapter`): the build finds it in its
    cache, as a second `make book` would, and executes the library page only."""
    src = copy_repo(tmp_path_factory.mktemp("repo"))
    chapter = nbval_chapter(BUILT_CHAPTER.rsplit("/", 1)[-1])
    if chapter is not None:
        seed_build(src, BUILT_CHAPTER, chapter)
    r = build_copy(src)
    assert r.returncode == 0, r.stdout[-6000:]
    return src, r.stdout
