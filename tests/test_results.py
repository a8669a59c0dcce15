"""Results files and the paper values: every committed results file is complete, names only known
claim ids, and has no failing required claim; the scorecard rows are exactly its claims."""
import json

import pytest

from coreinv.presets import PRESET_NAMES, preset_name
from coreinv.results import load_results, paper_values, scorecard_rows
from helpers import REPO

PAPER = paper_values()
COMMITTED = [(preset, chapter) for preset in ("book", "paper")
             for chapter in load_results(preset, REPO / "results")]


def test_paper_values_are_complete():
    assert PAPER, "results/paper_values.json is empty"
    for cid, v in PAPER.items():
        # "chapter.claim", or "chapter.group.claim" for a claim measured again on another group of models
        # (issue 40: agreement.pretrained.* on the pretrained LMs)
        assert cid.count(".") in (1, 2) and all(cid.split(".")), cid
        assert {"title", "claim", "paper", "source"} <= set(v), cid   # title: its row in a verdict table


# a chapter's claim ids start with its name, or with the prefix its issue gave them
CLAIM_PREFIX = {"sae_gap": "sae"}


@pytest.mark.parametrize("preset, chapter", COMMITTED)
def test_committed_results(preset, chapter):
    res = load_results(preset, REPO / "results")[chapter]
    assert res["preset"] == preset and res["chapter"] == chapter
    assert {"claims", "config", "seeds", "versions", "device", "wall_time_s"} <= set(res)
    assert res["claims"], "a results file without claims"
    for c in res["claims"]:
        assert set(c) == {"id", "claim", "paper", "measured", "threshold", "passed", "required", "testable", "decided",
                          "summary"}
        assert c["summary"], f"{c['id']}: no summary (the measurement in words the scorecard shows)"
        assert c["testable"] or not (c["passed"] or c["required"]), f"{c['id']}: not testable, yet passed or required"
        assert c["decided"] or not (c["passed"] or c["required"]), f"{c['id']}: undecided, yet passed or required"
        assert c["id"] in PAPER and c["id"].startswith(CLAIM_PREFIX.get(chapter, chapter) + "."), c["id"]
        assert c["claim"] == PAPER[c["id"]]["claim"], f"{c['id']}: claim text differs from paper_values.json"
        assert isinstance(c["passed"], bool)
        assert not (c["required"] and not c["passed"]), f"required claim {c['id']} failed"
    rows = [r for r in scorecard_rows(preset, REPO / "results") if r["chapter"] == chapter]
    assert [r["id"] for r in rows] == [c["id"] for c in res["claims"]]


def test_preset_names():
    assert set(PRESET_NAMES) == {"ci", "book", "paper"}
    with pytest.raises(ValueError, match="unknown preset"):
        preset_name("huge")


def test_results_files_are_strict_json():
    for p in (REPO / "results").rglob("*.json"):
        json.loads(p.read_text(), parse_constant=lambda c: pytest.fail(f"{p} holds {c}"))
