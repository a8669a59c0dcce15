"""Committed results come from the current code (issue 12, "Both chapters"): every `results/book/*.json`
names the code it ran as it is now (the modules its chapter imports: `provenance(chapter)`) and the code of
its chapter notebook as it is now. The rule is
`coreinv.results.stale_results`, the same one `make book` applies to a fresh build; its unit tests
here show it passing on a file written now and failing on a stale one."""
import json

import pytest

from coreinv.results import (chapter_notebook, load_results, notebook_hash, provenance, regime_rows,
                             stale_results, write_results)
from helpers import REPO


def test_committed_book_results_come_from_the_current_code():
    stale = stale_results("book", REPO / "results", source=REPO)
    assert not stale, ("committed results/book/ are older than their code; re-run `make publish`:\n"
                       + "\n".join(f"  {c}: {why}" for c, why in stale))


def test_committed_regime_records_are_current_and_flip_nothing():
    """`make publish` runs every chapter again under the other float kernels (tools/regimes.py): each chapter has
    that record, made by the code that made its results, and no claim goes from holds to does not hold (or pass
    to FAIL) between the two; a claim that changes state otherwise is named on the scorecard."""
    rows = regime_rows("book", REPO / "results", REPO / "results" / "book" / "regimes")
    missing = set(load_results("book", REPO / "results")) - {r["chapter"] for r in rows}
    assert not missing, f"no record under the other float kernels for {sorted(missing)}: re-run `make publish`"
    old = sorted({r["chapter"] for r in rows if not r["current"]})
    assert not old, f"the records under the other float kernels of {old} are of other code: re-run `make publish`"
    flipped = [(r["id"], r["here"], r["other"]) for r in rows if r["flipped"]]
    assert not flipped, f"verdicts that rounding decides (here, under {rows[0]['capability_other']}): {flipped}"


def _write(root, chapter="markov"):
    write_results(chapter, [], config={}, seeds=[0], wall_time_s=0, preset="book", root=root)
    return root / "book" / f"{chapter}.json"


def _edit(path, **prov):
    doc = json.loads(path.read_text())
    for k, v in prov.items():
        if v is None: doc["provenance"].pop(k, None)
        else: doc["provenance"][k] = v
    path.write_text(json.dumps(doc))


def test_a_file_written_now_is_current(tmp_path):
    f = _write(tmp_path)
    prov = json.loads(f.read_text())["provenance"]
    assert prov["library"] == provenance("markov")["library"]
    assert prov["notebook"] == notebook_hash(chapter_notebook("markov"))
    assert stale_results("book", tmp_path) == []
    assert stale_results("book", tmp_path, environment=True) == []


@pytest.mark.parametrize("change, words", [(dict(library="0123456789ab"), "library 0123456789ab"),
                                           (dict(notebook="0123456789ab"), "notebook code 0123456789ab"),
                                           (dict(notebook=None), "notebook code None"),
                                           (dict(library=None), "library None")])
def test_a_stale_file_is_named_with_its_reason(tmp_path, change, words):
    _edit(_write(tmp_path), **change)
    stale = stale_results("book", tmp_path)
    assert [c for c, _ in stale] == ["markov"] and words in stale[0][1], stale


def test_environment_counts_only_when_asked(tmp_path):
    _edit(_write(tmp_path), key="0123456789ab")
    assert stale_results("book", tmp_path) == []
    assert "code 0123456789ab" in stale_results("book", tmp_path, environment=True)[0][1]


def test_missing_chapters_and_notebooks_are_stale(tmp_path):
    _write(tmp_path, "no_such_chapter")
    stale = dict(stale_results("book", tmp_path, chapters=["markov", "no_such_chapter"]))
    assert stale["markov"].startswith("no results")
    assert "no chapter notebook" in stale["no_such_chapter"]


def test_the_notebook_hash_is_the_code_cells_only(tmp_path):
    nb = json.loads(chapter_notebook("markov").read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code": cell["outputs"], cell["execution_count"] = [], None
        else: cell["source"] = "other prose"
    nb["metadata"] = {"kernelspec": {"name": "other"}}
    (tmp_path / "a.ipynb").write_text(json.dumps(nb))
    assert notebook_hash(tmp_path / "a.ipynb") == notebook_hash(chapter_notebook("markov"))
    next(c for c in nb["cells"] if c["cell_type"] == "code")["source"] += "\nx = 1"
    (tmp_path / "a.ipynb").write_text(json.dumps(nb))
    assert notebook_hash(tmp_path / "a.ipynb") != notebook_hash(chapter_notebook("markov"))
