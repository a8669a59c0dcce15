"coreinv.tasks.agreement.real: the one-token rule for verb forms and the pairs every model scores (no model loaded)."
import pytest

from coreinv.tasks.agreement.axis import AgreementModel
from coreinv.tasks.agreement.corpus import test_pairs
from coreinv.tasks.agreement.real import scorable, verb_pieces, whole_verbs


class Splitter:
    "A tokenizer that keeps a word whole unless it is in `split`, where it gives two pieces."
    def __init__(self, split=()): self.split, self.vocab = set(split), {}
    def encode(self, text, add_special_tokens=False):
        w = text.strip()
        parts = [w[:2], w[2:]] if w in self.split else [w]
        return [self.vocab.setdefault(p, len(self.vocab)) for p in parts]


def _am(name, tok):
    ids = {w: i[0] for w, i in verb_pieces(tok).items() if len(i) == 1}
    am = AgreementModel.__new__(AgreementModel)                          # no model: only verb_ids is read
    am.name, am.verb_ids = name, ids
    return am


def test_whole_verbs_keeps_the_lexicon_order_and_drops_split_forms():
    words = ["is", "are", "criticizes", "criticize"]
    assert verb_pieces(Splitter({"criticizes"}), words)["criticizes"] != verb_pieces(Splitter(), words)["is"]
    assert whole_verbs(Splitter({"criticizes"}), words) == ["is", "are", "criticize"]


def test_scorable_keeps_the_pairs_every_model_scores_and_counts_the_rest():
    pairs = test_pairs(4, 0, "pp")
    verbs = sorted({p.correct for p in pairs} | {p.wrong for p in pairs})
    a, b = _am("a", Splitter({verbs[0]})), _am("b", Splitter({verbs[-1]}))
    kept, counts = scorable(pairs, a, b)
    gone = [p for p in pairs if {p.correct, p.wrong} & {verbs[0], verbs[-1]}]
    assert len(kept) == len(pairs) - len(gone) and counts["pp"] == {"pairs": len(pairs), "kept": len(kept),
                                                                       "left out": len(gone)}
    assert scorable(pairs, a)[0] != [] and len(scorable(pairs, a)[0]) >= len(kept)
    with pytest.raises(ValueError, match="at least one"):
        scorable(pairs)
    with pytest.raises(ValueError, match=r"no pair.*every model \(c\)"):
        scorable(pairs, _am("c", Splitter(verbs)))
