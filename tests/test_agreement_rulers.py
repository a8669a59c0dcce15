"""The agreement chapter's rulers (issue 24) on language models whose answer is planted by construction.

`PlantedLM` is a word-level model of the agreement language, built (not trained) in milliseconds. At its
layer "carry" (the second of four: "embed", "carry", "mix", "read") the number of the sentence's first noun (the subject, for the constructions used here) is
written on a known direction from the subject onward; its layer "read" is a causal mean over positions
(later positions re-read earlier ones, as attention does), and every verb's singular − plural logit margin
reads that direction, plus a small verb-specific nuisance. The one-direction model must pass one_dim,
sufficient, necessary and flip; its twin carries number on two orthogonal directions (each subject noun
with its own mix of both), each read by half of the verbs: it must fail one_dim at k = 1 and pass at k = 2.
(It cannot fail necessary at k = 1: removing ACE's top direction, near the diagonal of the two, leaves
residuals whose sign differs between the two kinds of noun, so the mean retained margin is near 0 already.
A linear model whose two channels carry number redundantly carries it on one direction of the data,
which is what ACE sees; tried here with shared gains and with per-token noise on both channels.)
The old rulers (centred readout, ablation at the last token, whole-sentence parse) must get the first model wrong.
"""
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from coreinv.ablate import ablate, random_core
from coreinv.base import Core
from coreinv.ace import ACE
from coreinv.tasks.agreement import corpus as corp, language as lang
from coreinv.tasks.agreement import axis as ax
from coreinv.tasks.agreement import rulers as ar

CONS = ("simple", "adverb", "pp", "subj_rc", "obj_rc", "vp_coord")   # the first noun is the subject


class PlantedLM(nn.Module):
    """Subject number on direction e0 (or on e0 and e1) at "carry", from the subject's position onward."""

    def __init__(self, vocab: corp.WordVocab, redundant: bool = False, D: int = 10, a: float = 12.0,
                 b: float = 0.3, seed: int = 0):
        super().__init__()
        lex = lang.default_lexicon()
        V = len(vocab.itos)
        num, gains = torch.zeros(V), torch.zeros(V, 2)
        for n in lex.nouns:
            g = ((1.0, 0.3) if n.animate else (0.3, 1.0)) if redundant else (1.0, 0.0)
            for w, s in ((n.sg, 1.0), (n.pl, -1.0)):
                num[vocab.stoi[w]], gains[vocab.stoi[w]] = s, torch.tensor(g)
        E = torch.randn(V, D, generator=torch.Generator().manual_seed(seed))
        E[:, :2] = 0                                              # the nuisance lives off e0, e1
        pairs = list(dict.fromkeys((v.sg, v.pl) for v in lex.verbs))
        self.register_buffer("num", num); self.register_buffer("gains", gains); self.register_buffer("E", E)
        self.register_buffer("sg", torch.tensor([vocab.stoi[s] for s, _ in pairs]))
        self.register_buffer("pl", torch.tensor([vocab.stoi[p] for _, p in pairs]))
        self.reads = torch.tensor([i % 2 if redundant else 0 for i in range(len(pairs))])  # which direction
        self.nuis = torch.tensor([2 + i % (D - 2) for i in range(len(pairs))])
        self.V, self.a, self.b = V, a, b
        self.device_anchor = nn.Parameter(torch.zeros(1), requires_grad=False)    # the measures read the device
        self.embed, self.carry, self.mix, self.read = nn.Identity(), nn.Identity(), nn.Identity(), nn.Identity()
        self.hook_layers = ["embed", "carry", "mix", "read"]

    def forward(self, tokens):                                     # [b, T] → [b, T, V]
        n = self.num[tokens]                                       # ±1 at nouns
        first = (n != 0) & ((n != 0).cumsum(1) == 1)               # the first noun
        s = (n * first).cumsum(1)                                  # its number, from it onward; 0 before
        g = (self.gains[tokens] * first[..., None]).sum(1, keepdim=True)    # [b, 1, 2]: its gains
        h = self.embed(self.E[tokens].clone())                     # [b, T, D]: no number on e0, e1 yet
        h = h.clone()
        h[..., :2] = h[..., :2] + s[..., None] * g
        h = self.mix(self.carry(h))                                # [b, T, D]: written at "carry", passed on
        r = self.read(h.cumsum(1) / torch.arange(1, h.shape[1] + 1, device=h.device)[None, :, None])
        m = self.a * r[..., self.reads] + self.b * r[..., self.nuis]          # [b, T, n_verbs]
        out = torch.zeros(*tokens.shape, self.V, dtype=h.dtype)
        out[..., self.sg] = 5 + m / 2
        out[..., self.pl] = 5 - m / 2
        return out


@pytest.fixture(scope="module")
def planted():
    vocab = corp.WordVocab.from_lexicon()
    pairs = [p for c in CONS for p in corp.test_pairs(8, 7, c)]
    out = {}
    for name, red in (("one", False), ("two", True)):
        am = ax.word_model(name, PlantedLM(vocab, red).eval(), vocab)
        out[name] = am
    return out, pairs


def test_planted_models_agree(planted):
    ams, pairs = planted
    for am in ams.values():
        assert ax.accuracy(am, pairs) == 1.0


def test_readout_uncentred_passes_and_centred_fails(planted):
    ams, pairs = planted
    hook = "carry"
    ace = ax.fit_axis(ams["one"], pairs, hook)                         # new: uncentred
    sv = ace.singular_values_.double()
    assert sv[1] / sv[0] <= 0.1                                        # one_dim holds
    axis = ax.oriented_axis(ace, ax.last_acts(ams["one"], pairs, hook), pairs)
    assert abs(axis.basis[0, 0]) > 0.95               # ... on the planted direction (the nuisance tilts it a little)
    with pytest.warns(RuntimeWarning, match="center_outputs"):
        old = ax.fit_axis(ams["one"], pairs, hook, center=True)      # old: centred across verbs
    so = old.singular_values_.double()
    assert so[1] / so[0] > 0.1 and abs(old.basis_[0, 0]) < 0.5       # the old ruler misses it
    two = ax.fit_axis(ams["two"], pairs, hook).singular_values_.double()
    assert two[1] / two[0] > 0.1 and two[2] / two[1] <= 0.1          # twin: fails at k = 1, passes at k = 2


def test_necessity_from_the_subject(planted):
    ams, pairs = planted
    am, hook = ams["one"], "carry"
    ace = ax.fit_axis(am, pairs, hook)
    st = ar.subject_starts(am, pairs)
    intact = ax.margins(am, pairs)
    new = ar.necessary_k(am, pairs, hook, ace, st, intact=intact)
    assert new["k"] == 1 and new["per_k"][1]["retained"] <= 0.1
    old = ar.ablation_scores(am, pairs, hook, ace.core(1), "remove", None, intact)   # the last token only
    assert old["acc_mean"] > 0.6 and old["retained"]["mean"] > 0.1     # the old ruler: "not necessary"
    rand = random_core(ace.mean_.shape[0], 1, ace.mean_.double(), seed=0)
    ctl = ar.ablation_scores(am, pairs, hook, rand, "remove", st, intact)
    assert ctl["acc_mean"] > 0.6 and ctl["retained"]["mean"] > 0.1     # the control keeps agreement
    two = ams["two"]
    ace2 = ax.fit_axis(two, pairs, hook)
    st2 = ar.subject_starts(two, pairs)
    k2 = ar.ablation_scores(two, pairs, hook, ace2.core(2), "remove", st2)
    assert k2["acc_mean"] <= 0.6 or k2["retained"]["mean"] <= 0.1      # necessary at k = 2
    keep2 = ar.ablation_scores(two, pairs, hook, ace2.core(2), "keep", st2)
    assert keep2["acc_mean"] >= 0.9 and keep2["retained"]["lo"] >= 0.5


def test_sufficiency_by_margin(planted):
    ams, pairs = planted
    am, hook = ams["one"], "carry"
    ace = ax.fit_axis(am, pairs, hook)
    axis = ax.oriented_axis(ace, ax.last_acts(am, pairs, hook), pairs)
    st = ar.subject_starts(am, pairs)
    r = ar.ablation_scores(am, pairs, hook, axis, "keep", st)
    assert r["acc_mean"] >= 0.9 and r["retained"]["lo"] >= 0.5
    rand = random_core(axis.d, 1, axis.mean, seed=0)
    c = ar.ablation_scores(am, pairs, hook, rand, "keep", st)
    assert c["acc_mean"] < 0.9 or c["retained"]["lo"] < 0.5


def test_flip_by_first_verb(planted):
    ams, pairs = planted
    am, hook = ams["one"], "carry"
    ace = ax.fit_axis(am, pairs, hook)
    axis = ax.oriented_axis(ace, ax.last_acts(am, pairs, hook), pairs)
    src = pairs[::4]
    st = ar.subject_starts(am, src)
    for sample in (False, True):
        ceil = ar.flip_first_verb(am, src, hook, None, st, sample=sample)["agreeing"]
        new = ar.flip_first_verb(am, src, hook, axis, st, sample=sample)
        assert ceil > 0.8 and new["reversed"] >= 0.9 * ceil
        rand = ar.flip_first_verb(am, src, hook, random_core(axis.d, 1, axis.mean, seed=1), st, sample=sample)
        assert rand["reversed"] < 0.9 * ceil
    # The old whole-sentence ruler (ax.flip_generation) is not asserted here: the planted model never
    # emits ".", so it would fail that ruler for that reason alone, not for the one the ruler gets wrong.


def test_spearman_against_the_label():
    rng = np.random.default_rng(0)
    y = np.repeat(["sg", "pl"], 200)
    lab = np.where(y == "sg", 3.0, -3.0)
    only = ar.spearman_vs_label(lab + rng.normal(size=400), lab + rng.normal(size=400), y, n_boot=100)
    assert only["rho"] > 0.7 and only["excess"] < 0.1                  # fails the rule: label only
    shared = rng.normal(size=400)
    both = ar.spearman_vs_label(lab + shared + 0.2 * rng.normal(size=400), lab + shared + 0.2 * rng.normal(size=400),
                                y, n_boot=100)
    assert both["excess"] >= 0.1 and both["within"]["sg"]["lo"] > 0.5
    with pytest.raises(ValueError, match="equal 1-D"):
        ar.spearman_vs_label(lab, lab[:-1], y)


def test_ablate_positions_and_errors():
    net = nn.Sequential(nn.Identity(), nn.Linear(4, 3))
    core = Core(torch.eye(4, dtype=torch.float64)[:, :2], torch.zeros(4, dtype=torch.float64))
    x = torch.randn(3, 5, 4)
    got = {}
    h = net[1].register_forward_pre_hook(lambda m, i: got.__setitem__("a", i[0].clone()))
    starts = torch.tensor([0, 2, 4])
    mask = torch.arange(5)[None] >= starts[:, None]
    for pos in (starts, mask):
        with ablate(net, "0", core, "remove", pos=pos), torch.no_grad():
            net(x)
        moved = (got["a"] - x).abs().amax(-1) > 0
        assert torch.equal(moved, mask)
    with ablate(net, "0", core, "remove", pos=slice(3, None)), torch.no_grad():
        net(x)
    assert torch.equal((got["a"] - x).abs().amax(-1) > 0, (torch.arange(5) >= 3).expand(3, 5))
    h.remove()
    for bad, msg in ((torch.tensor([1, 2]), "start positions"), (torch.ones(3, 4, dtype=torch.bool), "mask"),
                     (7, "outside")):
        with pytest.raises(ValueError, match=msg), ablate(net, "0", core, "remove", pos=bad), torch.no_grad():
            net(x)


def test_ace_warns_only_when_centring_removes_the_shared_part():
    g = torch.Generator().manual_seed(0)
    acts = torch.randn(300, 6, generator=g, dtype=torch.float64)
    w = torch.tensor([1.0, 0, 0, 0, 0, 0], dtype=torch.float64)
    same_sign = lambda h: (h @ w)[:, None] * torch.tensor([1.0, 1.2, 0.8, 1.1], dtype=torch.float64) + 0.01 * h[:, 1:5]
    with pytest.warns(RuntimeWarning, match="center_outputs"):
        ACE().fit(acts, same_sign)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ACE(center_outputs=False).fit(acts, same_sign)
        W = torch.randn(6, 4, generator=g, dtype=torch.float64)
        ACE().fit(acts, lambda h: h @ (W - W.mean(1, keepdim=True)))      # outputs that differ: no warning


def test_layer_rule_picks_the_writing_layer_not_the_readout(planted):
    """Number is written at "carry" (layer 1 of 4). Removing the axis there, at "mix" and at "read" takes
    agreement away; at "read", the hook the output reads directly, it removes the readout direction itself.
    The old rule (smallest retained margin, ties late) picks "read" and calls it late; the new one
    (earliest at or below 0.1, the final hook left out) picks "carry"."""
    ams, pairs = planted
    am = ams["one"]
    st, intact = ar.subject_starts(am, pairs), ax.margins(am, pairs)
    ret = [ar.ablation_scores(am, pairs, h, ax.fit_axis(am, pairs, h).core(1), "remove", st, intact,
                              n_boot=50)["retained"]["mean"] for h in am.layers]
    assert ret[0] > 0.9 and max(ret[1:]) <= 0.1                        # embed keeps it; the rest remove it
    old = min(range(len(ret)), key=lambda i: (ret[i], -i))
    new = ar.choose_layer(ret, 0.1)
    assert am.layers[old] == "read" and old >= len(ret) / 2             # old: the readout, "late"
    assert am.layers[new["layer"]] == "carry" and new["reached"]
    assert new["late_testable"] and not new["late"]                    # new: early, as planted
    with pytest.raises(ValueError, match="≥ 2 layers"):
        ar.choose_layer([0.0])
    with pytest.raises(ValueError, match="finite"):
        ar.choose_layer([0.5, float("nan"), 0.0])


def test_spearman_within_cells_separates_a_shared_attractor():
    """Within one subject number, two codes that both let the attractor pull them correlate; within a cell they don't.

    The planted pair shares the subject's number and the attractor's (and nothing else): the old within-number
    ρ calls that a shared order, the within-cell ρ does not. Its twin shares an order inside every cell."""
    rng = np.random.default_rng(1)
    y = np.repeat(["sg", "pl"], 400)
    att = rng.choice(["S", "P"], 800)
    cells = np.char.add(np.where(y == "sg", "S", "P"), att)
    lab, a = np.where(y == "sg", 3.0, -3.0), np.where(att == "S", 1.0, -1.0)
    attr = ar.spearman_vs_label(lab + a + 0.3 * rng.normal(size=800), lab + a + 0.3 * rng.normal(size=800), y,
                                n_boot=100, cells=cells)
    assert set(attr["within_cell"]) == {"SS", "SP", "PS", "PP"}
    assert min(w["rho"] for w in attr["within"].values()) > 0.5                 # per number: "shared order"
    assert all(w["lo"] < 0 < w["hi"] and abs(w["rho"]) < 0.2 for w in attr["within_cell"].values())
    shared = rng.normal(size=800)
    both = ar.spearman_vs_label(lab + a + shared + 0.2 * rng.normal(size=800),
                                lab + a + shared + 0.2 * rng.normal(size=800), y, n_boot=100, cells=cells)
    assert all(w["lo"] > 0.5 and w["n"] >= 150 for w in both["within_cell"].values())
    with pytest.raises(ValueError, match="one cell per sentence"):
        ar.spearman_vs_label(lab, lab, y, cells=cells[:-1])


def test_coordination_flip_acts_from_the_subject_only(planted, monkeypatch):
    """The decision for non-noun positions: reflect from the subject's first token on, never before it."""
    ams, pairs = planted
    am, hook = ams["one"], "carry"
    axis = ax.oriented_axis(ax.fit_axis(am, pairs, hook), ax.last_acts(am, pairs, hook), pairs)
    coord = [p for p in pairs if p.construction == "vp_coord"]
    st = ar.subject_starts(am, coord)
    assert (st >= 1).all()                                         # the start token and the determiner come first
    seen, real = [], ax.ablate

    def spy(model, hook_name, core, mode, pos=None):
        seen.append(None if pos is None else pos.tolist())
        return real(model, hook_name, core, mode, pos=pos)
    monkeypatch.setattr(ax, "ablate", spy)
    ceil = ax.flip_coordination(am, coord, hook, None, st)
    new = ax.flip_coordination(am, coord, hook, axis, st)
    assert seen == [[int(s)] for s in st]                          # one call per pair, from its subject on
    assert ceil["reversed"] == 0.0 and new["reversed"] >= 0.9 and new["later_reversed"] >= 0.9
    rand = ax.flip_coordination(am, coord, hook, random_core(axis.d, 1, axis.mean, seed=1), st)
    assert rand["reversed"] < 0.9
    with pytest.raises(ValueError, match="starts for"):
        ax.flip_coordination(am, coord, hook, axis, st[:-1])
