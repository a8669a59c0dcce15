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


def test_split_pairs_halves_each_construction_and_number():
    import numpy as np
    from coreinv.tasks.agreement.real import split_pairs
    pairs = test_pairs(4, 0, "pp") + test_pairs(4, 0, "simple")
    tr, te = split_pairs(pairs, seed=3)
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(len(pairs)))
    for c in ("pp", "simple"):
        for n in ("sg", "pl"):
            g = [i for i, p in enumerate(pairs) if p.construction == c and p.subject_number == n]
            assert abs(len(set(g) & set(tr)) - len(set(g) & set(te))) <= 1
    assert (split_pairs(pairs, seed=3)[0] == tr).all()


def test_interchange_sources_take_the_other_number_of_the_same_construction():
    from coreinv.tasks.agreement.real import interchange_sources
    pairs = test_pairs(4, 0, "pp") + test_pairs(4, 0, "obj_rc")
    src = interchange_sources(pairs, seed=1)
    assert all(pairs[j].subject_number != p.subject_number and pairs[j].construction == p.construction
               for p, j in zip(pairs, src))
    only_sg = [p for p in pairs if p.subject_number == "sg"]
    with pytest.raises(ValueError, match="no pair has a pl subject"):
        interchange_sources(only_sg)
    one = [p for p in pairs if p.construction == "pp" and p.subject_number == "sg"] + \
          [p for p in pairs if p.construction == "obj_rc" and p.subject_number == "pl"]
    src = interchange_sources(one)                 # no other number in its own construction: another's
    assert all(one[j].subject_number != p.subject_number for p, j in zip(one, src))


def test_shuffled_null_is_high_for_shared_groups_and_low_for_a_shared_order_within_them():
    import numpy as np
    from scipy.stats import spearmanr
    from coreinv.tasks.agreement.real import shuffled_null
    rng = np.random.default_rng(0)
    grp = np.repeat(np.arange(8), 25)
    level, within = rng.normal(size=8)[grp], rng.normal(size=200)
    a, b = level + 0.2 * rng.normal(size=200), level + 0.2 * rng.normal(size=200)
    assert shuffled_null(a, b, grp) > 0.8 * spearmanr(a, b)[0]
    a, b = within + 0.2 * rng.normal(size=200), within + 0.2 * rng.normal(size=200)
    assert abs(shuffled_null(a, b, grp)) < 0.15 < spearmanr(a, b)[0]
    assert shuffled_null(a, b, np.arange(200)) == pytest.approx(spearmanr(a, b)[0])   # singletons keep their value
    with pytest.raises(ValueError, match="one entry per sentence"):
        shuffled_null(a, b[:5], grp)
