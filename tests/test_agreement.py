"""Unit tests for coreinv.tasks.agreement.language and .corpus: lexicon, constructions, corpus, test pairs, the agreement checker,
vocabularies. (The module is imported as `ag`: its function `test_pairs` would otherwise be collected.) That a corpus is
the same across processes and hash seeds, nbs/24_agreement_corpus.ipynb shows and checks."""
from collections import Counter

import pytest

from coreinv.tasks.agreement import corpus as corp, language as lang

LEX = lang.default_lexicon()
FLIP = {v.sg: v.pl for v in LEX.verbs} | {v.pl: v.sg for v in LEX.verbs}
NOUN_NUM = {f: num for n in LEX.nouns for num, f in (("sg", n.sg), ("pl", n.pl))}


@pytest.mark.parametrize("sg,pl", [("man", "men"), ("woman", "women"), ("child", "children"), ("person", "people"),
                                   ("mouse", "mice"), ("tooth", "teeth"), ("thief", "thieves"), ("wolf", "wolves"),
                                   ("baby", "babies"), ("church", "churches"), ("ox", "oxen")])
def test_irregular_plurals(sg, pl):
    assert {n.sg: n.pl for n in LEX.nouns}[sg] == pl


@pytest.mark.parametrize("sg,pl", [("is", "are"), ("was", "were"), ("has", "have"), ("does", "do"),
                                   ("runs", "run"), ("carries", "carry"), ("teaches", "teach")])
def test_verb_forms(sg, pl):
    assert {v.sg: v.pl for v in LEX.verbs}[sg] == pl


def test_lexicon_refuses_a_word_in_two_categories():
    with pytest.raises(ValueError, match="'leaves'"):
        lang.build_lexicon(verbs=lang._VERBS + [("leaves", "intrans", "inanimate", None)])
    with pytest.raises(ValueError, match="'sheep'"):
        lang.build_lexicon(inanimate=lang._INANIMATE + ["sheep"])


@pytest.mark.parametrize("construction", lang.CONSTRUCTIONS)
def test_pairs_balanced_and_labelled(construction):
    pairs = corp.test_pairs(15, seed=0, construction=construction)
    cells = Counter(p.cell for p in pairs)
    want = {"S", "P"} if construction in lang.NO_ATTRACTOR else {"SS", "SP", "PS", "PP"}
    assert set(cells) == want and set(cells.values()) == {15}
    for p in pairs:
        s = p.sentence
        subj = [v for v in corp.label(s.words) if v.index == s.target_index][0]
        assert NOUN_NUM[s.words[subj.subject_index]] == p.subject_number
        assert p.correct == s.words[s.target_index] and p.wrong == FLIP[p.correct]
        assert (p.attractor_number is None) == (construction in lang.NO_ATTRACTOR)


@pytest.mark.parametrize("construction", lang.CONSTRUCTIONS)
def test_checker_accepts_generated_and_rejects_flipped(construction):
    sents = corp.corpus(300, seed=1, constructions=[construction], mix={construction: 1.0})
    for s in sents:
        r = corp.agrees(s.words)
        assert r.ok and tuple(v.index for v in r.verbs) == s.agreeing, s.text
        for i in s.agreeing:
            w = list(s.words)
            w[i] = FLIP[w[i]]
            bad = corp.agrees(w)
            assert bad.status == "disagrees" and [v.index for v in bad.verbs if not v.agrees] == [i]
    if construction == "vp_coord":
        assert all(s.verb2_index in s.agreeing for s in sents)


def test_cannot_label_names_word_and_model():
    assert corp.agrees("The keys near the cabinet are purple.").status == "cannot label"
    with pytest.raises(ValueError, match="gpt2.*'purple'"):
        corp.agrees("The keys near the cabinet are purple.", strict=True, source="gpt2")
    with pytest.raises(corp.CannotLabel, match="gpt2.*'purple'"):
        corp.label("The keys near the cabinet are purple.", source="gpt2")


def test_disjoint_both_ways():
    train = corp.corpus(5000, seed=0)
    seen = corp.prefixes(train)
    pairs = corp.test_pairs(20, seed=1, construction="subj_rc", exclude=train)
    assert not any(" ".join(p.prefix) in seen for p in pairs)
    held = corp.test_pairs(20, seed=1, construction="simple")
    assert any(" ".join(p.prefix) in seen for p in held)          # the check has something to catch
    seen_h = corp.prefixes(corp.corpus(5000, seed=0, holdout=held))
    assert not any(" ".join(p.prefix) in seen_h for p in held)


def test_vocab_and_single_tokens():
    vocab = corp.WordVocab.from_lexicon()
    s = corp.corpus(1, seed=0)[0]
    assert vocab.decode(vocab.encode(s.words)) == list(s.words)
    assert set(corp.single_token_ids(vocab)) == set(LEX.verb_forms())
    with pytest.raises(ValueError, match="tiny.*'are'"):
        corp.single_token_ids(corp.WordVocab(["is"], name="tiny"), words=["is", "are"])

    class Splitter:                                   # a stand-in for a BPE tokenizer that splits "are"
        name_or_path = "toy-bpe"
        def encode(self, text, add_special_tokens=False):
            return [1, 2] if text == " are" else [3]
    with pytest.raises(ValueError, match="toy-bpe.*'are'"):
        corp.single_token_ids(Splitter(), words=["is", "are"])
