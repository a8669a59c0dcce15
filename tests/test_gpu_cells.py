"""The `gpu` cell tag, on both sides: nbval skips such cells without a GPU and runs them with one,
and the book leaves them unexecuted with a visible note without a GPU and runs them with one.
`COREINV_DEVICE` forces the answer of `coreinv.runtime.has_gpu()`, so both sides run on any machine
(a cell here only prints, so 'running it on a GPU' works on a CPU too)."""
import re
import shutil

import pytest

from helpers import BIN, REPO, make_notebook, run

CELLS = [("markdown", "# GPU demo", ()),
         ("code", "print('cpu cell ran')", ()),
         ("code", "print('gpu cell ran')", ("gpu",))]


@pytest.fixture
def demo(tmp_path):
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "_ext").mkdir()
    shutil.copy(REPO / "_ext" / "coreinv_kernels.py", tmp_path / "_ext")   # conftest's kernel managers
    make_notebook(tmp_path / "demo.ipynb", CELLS)
    return tmp_path


def _counts(out: str) -> dict:
    return {k: int(v) for v, k in re.findall(r"(\d+) (passed|skipped|failed|error)", out.splitlines()[-1])}


@pytest.mark.parametrize("device, expected", [("cpu", {"passed": 1, "skipped": 1}),
                                              ("cuda", {"passed": 2})])
def test_nbval_gpu_cells(demo, device, expected):
    # its one kernel only prints: a plain kernel, not one forked from a server that imports PyTorch first
    r = run([BIN / "python", "-m", "pytest", "--nbval-lax", "--nbval-current-env",
             "-p", "no:cacheprovider", "-c", "/dev/null", "--rootdir", str(demo), "demo.ipynb", "-rs"],
            cwd=demo, env={"COREINV_DEVICE": device, "COREINV_PRELOADED_KERNELS": "0"})
    assert r.returncode == 0, r.stdout
    assert _counts(r.stdout) == expected, r.stdout
    if device == "cpu":
        assert "needs a GPU" in r.stdout


def _book(tmp_path, device):
    src = tmp_path / "book"
    src.mkdir()
    make_notebook(src / "demo.ipynb", CELLS)
    (src / "_toc.yml").write_text("format: jb-book\nroot: demo\n")
    (src / "_config.yml").write_text(
        "title: demo\nonly_build_toc_files: true\nexecute:\n  execute_notebooks: force\n"
        f"sphinx:\n  local_extensions:\n    coreinv_book: {REPO / '_ext'}\n")
    r = run([BIN / "jupyter-book", "build", str(src), "-W", "-n", "--keep-going"],
            env={"COREINV_DEVICE": device}, cwd=src)
    assert r.returncode == 0, r.stdout[-3000:]
    return (src / "_build" / "html" / "demo.html").read_text()


def test_book_without_gpu_notes_and_skips(tmp_path):
    html = _book(tmp_path, "cpu")
    assert "cpu cell ran" in html
    # the gpu cell's code shows, its output does not, and the note does
    assert html.count("gpu cell ran") == 1, "only the source line, no output"
    assert "Needs a GPU" in html


def test_book_with_gpu_runs_the_cell(tmp_path):
    html = _book(tmp_path, "cuda")
    assert html.count("gpu cell ran") == 2, "source line and its output"
    assert "Needs a GPU" not in html
