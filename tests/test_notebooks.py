"""The notebook hygiene policy (tools/notebooks.py): every notebook in nbs/ keeps it, and the
checker itself catches each kind of breach."""
import sys

import nbformat
import pytest

from helpers import REPO, make_notebook

sys.path.insert(0, str(REPO / "tools"))
import notebooks as policy  # noqa: E402
import coreinv_book as book  # noqa: E402  (tools/notebooks.py put _ext on the path)

NOTEBOOKS = policy.notebooks()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.relative_to(REPO / "nbs").as_posix() for p in NOTEBOOKS])
def test_notebook_keeps_the_policy(path):
    assert policy.problems(path) == []


def _executed(tmp_path, counts, outputs=True, tags=((), ())):
    path = make_notebook(tmp_path / "nb.ipynb", [("code", f"x = {i}", t) for i, t in enumerate(tags)])
    nb = nbformat.read(path, as_version=4)
    for cell, n in zip(nb.cells, counts):
        cell.execution_count = n
        cell.outputs = [nbformat.v4.new_output("stream", text="hi\n")] if outputs and n else []
    nbformat.write(nb, path)
    return path


def test_clean_run_passes(tmp_path):
    assert policy.problems(_executed(tmp_path, [1, 2])) == []


def test_nulled_counts_with_outputs_fail(tmp_path):
    path = _executed(tmp_path, [1, 2])
    nb = nbformat.read(path, as_version=4)
    nb.cells[0].execution_count = None  # what nbdev_clean does
    nbformat.write(nb, path)
    assert any("no execution count" in p for p in policy.problems(path))


def test_out_of_order_run_fails(tmp_path):
    assert any("expected" in p for p in policy.problems(_executed(tmp_path, [1, 5])))


def test_unexecuted_cell_fails_unless_gpu(tmp_path):
    assert any("not executed" in p for p in policy.problems(_executed(tmp_path, [1, None])))
    assert policy.problems(_executed(tmp_path, [1, None], tags=((), ("gpu",)))) == []


def test_error_output_fails(tmp_path):
    path = _executed(tmp_path, [1, 2])
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="E", evalue="boom", traceback=[])]
    nbformat.write(nb, path)
    assert any("error output" in p for p in policy.problems(path))


def test_fix_cleans_metadata_and_keeps_outputs(tmp_path):
    path = _executed(tmp_path, [1, 2])
    nb = nbformat.read(path, as_version=4)
    nb.metadata["widgets"] = {"state": {}}
    nb.cells[0].metadata["execution"] = {"iopub.status.busy": "2026"}
    nbformat.write(nb, path)
    assert len(policy.problems(path)) == 2
    assert policy.fix(path) is True
    assert policy.problems(path) == []
    assert nbformat.read(path, as_version=4).cells[1].outputs[0]["text"] == "hi\n"
    assert policy.fix(path) is False  # idempotent


def test_wide_chapter_code_fails(tmp_path):
    (tmp_path / "chapters").mkdir()
    path = _executed(tmp_path / "chapters", [1, 2])
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = "x = " + "1 + " * 30 + "1"
    nbformat.write(nb, path)
    assert any("wider than" in p for p in policy.problems(path))
    assert not any("wider than" in p for p in policy.problems(_executed(tmp_path, [1, 2])))


def test_progress_bars_are_squashed():
    assert book.squash_progress("10%\r50%\r100%|done\nnext") == "100%|done\nnext"
    assert book.squash_progress("a\nbar 50%\r   \r\nb") == "a\nb", "a bar cleared with leave=False is dropped"


def test_progress_bar_messages_are_joined():
    stream = lambda t: nbformat.v4.new_output("stream", name="stderr", text=t)
    out = book.coalesce_streams([stream("bar   0%"), stream("\rbar  50%"), stream("\rbar 100%\n"),
                                    nbformat.v4.new_output("stream", name="stdout", text="done\n")])
    assert [o["text"] for o in out] == ["bar 100%\n", "done\n"]
