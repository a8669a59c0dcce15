"""Unit tests for coreinv.tasks.agreement.models, coreinv.tasks.agreement.axis and the ablation's flip mode: small models, bad input,
and the agreement chapter's claim rules failing on their negative controls."""
import functools
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from coreinv.ablate import ablate
from coreinv.base import Core
from coreinv.tasks.agreement import models as lm_mod
from coreinv.tasks.agreement.models import (ARCHS, LMSpec, TrainedLM, build_lm, cache_key, held_out_pairs, lm_folder,
                                            lm_info, train_or_load)
from coreinv.tasks.agreement import corpus as corp, language as lang
from coreinv.tasks.agreement import axis as ax
from coreinv.tasks.agreement import rulers as ar


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    "A tiny word-level LM (barely trained) and its AgreementModel, in a temporary cache."
    mp = pytest.MonkeyPatch()
    mp.setenv("COREINV_CACHE", str(tmp_path_factory.mktemp("cache")))
    spec = LMSpec(name="t", n_layers=2, d_model=16, n_heads=2, n_ctx=24, n_sentences=500, steps=5,
                  n_test_per_cell=2)
    lm = train_or_load(spec, progress=False)
    yield spec, ax.agreement_model(lm)
    mp.undo()


def test_lm_cached_and_info(tiny):
    spec, am = tiny
    info = lm_info(spec)
    assert info["steps"] == 5 and info["n_params"] == sum(p.numel() for p in am.model.parameters())
    assert am.name == "t" and am.layers == [f"blocks.{l}.hook_resid_post" for l in range(2)]


def test_train_or_load_loads_the_cache_without_training(tiny):
    """The second call of a spec loads its folder, writing nothing. (Patching `train` to fail cannot show it: the
    key follows the training code, so a patched `train` names another folder and trains there.)"""
    spec, am = tiny
    folder = lm_folder(spec)
    written = {f.name: f.stat().st_mtime_ns for f in folder.parent.rglob("*") if f.is_file()}
    again = train_or_load(spec, progress=False)
    assert {f.name: f.stat().st_mtime_ns for f in folder.parent.rglob("*") if f.is_file()} == written
    assert isinstance(again, TrainedLM) and again.folder == lm_folder(spec) and again.info == lm_info(spec)
    assert all(torch.equal(a, b) for a, b in zip(am.model.state_dict().values(), again.model.state_dict().values()))
    back = pickle.loads(pickle.dumps(again))                 # pickles as its spec; unpickling loads the cache
    assert back.spec == spec and back.info == again.info and len(pickle.dumps(again)) < 2000


def test_one_folder_rule_and_bad_arch(tmp_path, monkeypatch):
    monkeypatch.setenv("COREINV_CACHE", str(tmp_path))
    folders = {a: lm_folder(LMSpec(name="m", arch=a)) for a in ARCHS}
    assert len(set(folders.values())) == len(ARCHS) == len(set(lm_mod._TRAIN)) and tuple(lm_mod._TRAIN) == ARCHS
    assert all(f.name.startswith(f"m-{a}-") and f.parent == tmp_path / "lm" for a, f in folders.items())
    with pytest.raises(ValueError, match="unknown arch 'rnn'; known: hooked, lstm, bpe, gpt2"):
        LMSpec(name="m", arch="rnn")
    with pytest.raises(ValueError, match="spec must be an LMSpec"):
        train_or_load(dict(name="m"))


def test_key_follows_only_its_kinds_code(monkeypatch):
    "An edit of the LSTM's code (faked through the hash of its source) changes the LSTM's key, not the others'."
    from coreinv import keys
    specs = {a: LMSpec(arch=a) for a in ARCHS}
    before = {a: cache_key(s) for a, s in specs.items()}
    real = keys.syntax_hash

    @functools.wraps(real)          # the key follows `__wrapped__`, so it still hashes the real syntax_hash
    def edited(src, *a, **k):
        return real(src + ("\nEDIT = 1" if "class LSTMLM" in src else ""), *a, **k)
    monkeypatch.setattr(keys, "syntax_hash", edited)
    after = {a: cache_key(s) for a, s in specs.items()}
    assert after["lstm"] != before["lstm"]
    assert {a: after[a] for a in ("hooked", "bpe", "gpt2")} == {a: before[a] for a in ("hooked", "bpe", "gpt2")}


def test_lm_spec_key_and_bad_input():
    a = LMSpec()
    assert cache_key(a) == cache_key(LMSpec()) and cache_key(a) != cache_key(LMSpec(corpus_seed=1))
    assert build_lm(LMSpec(n_layers=4, positional="rotary")).cfg.n_layers == 4
    for bad in (dict(n_layers=0), dict(d_model=30), dict(positional="alibi"), dict(constructions=("x",)),
                dict(bpe_vocab=0)):
        with pytest.raises(ValueError, match="LMSpec"):
            LMSpec(**bad)


def _mlp_core():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)).eval()
    basis = torch.linalg.qr(torch.randn(8, 2, dtype=torch.float64))[0]
    return net, Core(basis, torch.randn(8, dtype=torch.float64))


def _act(net, x, *ctx):
    got = {}
    # what the next layer receives, i.e. after any replacement at "0"
    h = net[1].register_forward_pre_hook(lambda m, i: got.__setitem__("a", i[0].detach().clone()))
    try:
        with torch.no_grad():
            if ctx:
                with ctx[0]:
                    if len(ctx) > 1:
                        with ctx[1]: net(x)
                    else: net(x)
            else: net(x)
    finally:
        h.remove()
    return got["a"].double()


def test_flip_on_a_plain_module():
    "flip reverses the core coordinates, leaves the complement alone, and flipping twice is the identity."
    net, core = _mlp_core()
    x = torch.randn(10, 5)
    h = _act(net, x)
    hf = _act(net, x, ablate(net, "0", core, "flip"))
    assert torch.allclose(core.coords(hf), -core.coords(h), atol=1e-5)
    assert torch.allclose(core.remove(hf), core.remove(h), atol=1e-5)
    h2 = _act(net, x, ablate(net, "0", core, "flip"), ablate(net, "0", core, "flip"))
    assert torch.allclose(h2, h, atol=1e-5)
    assert not torch.allclose(hf, h, atol=1e-3)          # the control: one flip does change h


def test_measures_run_and_shapes(tiny):
    spec, am = tiny
    pairs = [p for ps in held_out_pairs(spec).values() for p in ps]
    m = ax.margins(am, pairs)
    assert m.shape == (len(pairs),) and np.isfinite(m).all()
    hook = am.layers[-1]
    ace1 = ax.fit_axis(am, pairs, hook, "own")
    acev = ax.fit_axis(am, pairs, hook, "verbs")
    assert ace1.rank_ == 1 and acev.rank_ > 1                 # O = 1 is rank 1 by construction; O = V is not
    val = ax.validate_layer(am, pairs, hook)
    assert set(val) == set(ax.BASELINES) and set(val["ace"]["keep"]) == set(lang.CONSTRUCTIONS)
    fl = ax.flip_generation(am, pairs[:3], hook, val and ax.layer_cores(am, pairs, hook)["ace"], max_new=4)
    assert 0 <= fl["reversed"] <= 1 and fl["n"] == 3


def test_margins_keep_full_core_is_intact(tiny):
    spec, am = tiny
    pairs = held_out_pairs(spec)["pp"]
    hook = am.layers[0]
    acts = ax.last_acts(am, pairs, hook)
    full = Core(torch.eye(acts.shape[1], dtype=torch.float64), acts.mean(0))
    assert np.allclose(ax.margins(am, pairs, hook=hook, core=full, mode="keep"), ax.margins(am, pairs), atol=1e-4)


def test_spearman_and_control():
    rng = np.random.default_rng(0)
    z = rng.normal(size=200)
    r = ar.axis_spearman(z, z + 0.1 * rng.normal(size=200), n_boot=100)
    assert r["rho"] > 0.9 and r["lo"] <= r["rho"] <= r["hi"] and abs(r["shuffled"]) < 0.3
    with pytest.raises(ValueError, match="equal"):
        ar.axis_spearman(z, z[:5])


def test_bad_input_names_word_and_model(tiny):
    _, am = tiny
    with pytest.raises(ValueError, match=r"'blorp'.*mymodel|mymodel.*'blorp'"):
        ax.pair_from_words("The keys near the cabinet blorp old.", "mymodel")
    with pytest.raises(ValueError, match=r"'t'.*'blorps'"):
        am.verb_id("blorps")
    with pytest.raises(ValueError, match="close names"):
        ax.AgreementModel("t", am.model, am.encode, am.decode, am.verb_ids, ["blocks.0.hook_resid_pots"])
    with pytest.raises(ValueError, match="readout"):
        ax.fit_axis(am, held_out_pairs(LMSpec(n_test_per_cell=1))["simple"], am.layers[0], "logits")


def test_tokenizer_splitting_a_verb_is_refused(tmp_path):
    from coreinv.models import load_local, tiny_local_model
    tiny_local_model("gpt2", tmp_path / "m")
    with pytest.raises(ValueError, match=r"tiny-gpt2.*(splits|lacks) the verb form"):
        ax.hf_model("tiny-gpt2", load_local(tmp_path / "m", device="cpu"))


def test_chapter_rules_fail_on_controls():
    "Each agreement claim's rule rejects its negative control (the values a control run gives)."
    from test_chapter_results import RULES
    from coreinv.tasks.agreement.presets import SIZES
    R, S = RULES["agreement"], dict(SIZES.at())
    good = {"agreement.learned": dict(simple=dict(a=1.0), untrained=0.5),
            # sufficient, necessary and spearman read 95% intervals; the random direction's own three-state
            # verdict must be "fails"
            "agreement.sufficient": dict(acc=dict(a=1.0), acc_interval=dict(a=[0.95, 1.0]),
                                         margin_interval=dict(a=[0.7, 0.9]), random_verdict=dict(a="fails")),
            "agreement.necessary": dict(k=dict(a=1), acc_interval=dict(a=[0.45, 0.55]),
                                        margin_interval=dict(a=[-0.05, 0.05]), random_verdict=dict(a="fails")),
            "agreement.flip": dict(ace=dict(a=0.7), ceiling=dict(a=0.75), random=dict(a=0.0)),
            "agreement.spearman": dict(interval=[0.85, 0.95], excess_interval=[0.15, 0.3])}
    for cid, m in good.items():
        assert R[cid](m, S), cid
    bad = {"agreement.learned": dict(simple=dict(a=1.0), untrained=1.0),
           "agreement.sufficient": dict(acc=dict(a=1.0), acc_interval=dict(a=[0.95, 1.0]),
                                        margin_interval=dict(a=[0.7, 0.9]), random_verdict=dict(a="holds")),
           "agreement.necessary": dict(k=dict(a=1), acc_interval=dict(a=[0.45, 0.55]),
                                       margin_interval=dict(a=[-0.05, 0.05]), random_verdict=dict(a="holds")),
           "agreement.flip": dict(ace=dict(a=0.7), ceiling=dict(a=0.75), random=dict(a=0.7)),
           # the label-only code: high correlation, nothing beyond the subject's number
           "agreement.spearman": dict(interval=[0.8, 0.9], excess_interval=[-0.05, 0.05])}
    for cid, m in bad.items():
        assert not R[cid](m, S), cid
    # an interval across the threshold is not a pass either (the chapter stores it as undecided)
    assert not R["agreement.spearman"](dict(interval=[0.75, 0.9], excess_interval=[0.15, 0.3]), S)
    assert not R["agreement.one_dim"](dict(ratio=dict(a=0.5)), S) and R["agreement.one_dim"](dict(ratio=dict(a=0.01)), S)
    assert not R["agreement.late"](dict(upper_half=dict(a=0.0, b=0.0)), S)


def test_pretrained_path_gpt2_on_cpu(tmp_path, monkeypatch):
    "Model 5's whole path: a BPE GPT-2 trained here, save_pretrained, load_local, then the measures."
    monkeypatch.setenv("COREINV_CACHE", str(tmp_path))
    spec = LMSpec(name="g", arch="gpt2", n_layers=2, d_model=16, n_heads=2, n_ctx=24, n_sentences=400, steps=5,
                  n_test_per_cell=2)
    lm = train_or_load(spec, progress=False)
    assert (lm.folder / "config.json").exists() and (lm.folder / "tokenizer.json").exists()
    am = ax.agreement_model(lm)
    pairs = held_out_pairs(spec)["pp"]
    assert np.isfinite(ax.margins(am, pairs)).all()
    ace = ax.fit_axis(am, pairs, am.layers[-1], "verbs")
    assert ace.rank_ >= 1
    val = ax.validate_layer(am, pairs, am.layers[-1])
    assert set(val) == set(ax.BASELINES)
    fl = ax.flip_generation(am, pairs[:2], am.layers[-1], ax.layer_cores(am, pairs, am.layers[-1])["ace"],
                            max_new=3)
    assert fl["n"] == 2


def test_bpe_hooked_transformer(tmp_path, monkeypatch):
    "Model 3: a HookedTransformer on BPE tokens trains, saves, reloads, and is read at the last subword token."
    monkeypatch.setenv("COREINV_CACHE", str(tmp_path))
    spec = LMSpec(name="b", arch="bpe", n_layers=2, d_model=16, n_heads=2, n_ctx=24, n_sentences=400, steps=5,
                  n_test_per_cell=2)
    lm = train_or_load(spec, progress=False)
    model, tok = lm.model, lm.tokenizer
    assert {"model.pt", "tokenizer.json", "info.json"} <= {p.name for p in lm.folder.iterdir()}
    again = train_or_load(spec, progress=False)
    again, tok2 = again.model, again.tokenizer
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert tok2.get_vocab() == tok.get_vocab()
    am = ax.hf_model("b", model, tok)
    pairs = held_out_pairs(spec)["pp"]
    p = pairs[0]
    ids = am.encode(p.prefix)
    assert len(ids) > 1 and ids[-1] == tok.encode(" " + p.prefix[-1], add_special_tokens=False)[-1]
    with torch.no_grad():
        lg = model(torch.tensor([ids]))[0, -1]
    sg, pl = (p.correct, p.wrong) if p.subject_number == "sg" else (p.wrong, p.correct)
    want = float(lg[am.verb_id(sg)] - lg[am.verb_id(pl)])
    assert ax.margins(am, [p])[0] == pytest.approx(want, abs=1e-4)


def test_bpe_tokenizer_splitting_a_verb_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("COREINV_CACHE", str(tmp_path))
    spec = LMSpec(name="small", arch="bpe", bpe_vocab=300, n_layers=1, d_model=16, n_heads=2, n_ctx=24,
                  n_sentences=200, steps=2, n_test_per_cell=2)
    lm = train_or_load(spec, progress=False)
    model, tok = lm.model, lm.tokenizer
    with pytest.raises(ValueError, match=r"small.*(splits|lacks) the verb form"):
        ax.hf_model("small", model, tok)


def test_sampled_flip_repeats_and_coordination(tiny):
    spec, am = tiny
    pairs = held_out_pairs(spec)
    hook = am.layers[-1]
    core = ax.layer_cores(am, pairs["pp"], hook)["ace"]
    a = ax.flip_generation(am, pairs["simple"], hook, core, max_new=6, sample=True, seed=3)
    b = ax.flip_generation(am, pairs["simple"], hook, core, max_new=6, sample=True, seed=3)
    assert a["examples"] == b["examples"] and a["reversed"] == b["reversed"] and a["n_later"] == b["n_later"]
    coord = pairs["vp_coord"]
    st = ar.subject_starts(am, coord)
    c = ax.flip_coordination(am, coord, hook, core, st, sample=True, seed=2)
    assert c == ax.flip_coordination(am, coord, hook, core, st, sample=True, seed=2) or np.isnan(c["later_reversed"])
    assert c["n"] == len(coord) and 0 <= c["n_later"] <= len(coord)
    ctl = ax.flip_coordination(am, coord, hook, None, st)
    assert ctl["n"] == len(coord) and 0 <= ctl["v2_reversed"] <= 1
    with pytest.raises(ValueError, match="vp_coord"):
        ax.flip_coordination(am, pairs["simple"], hook, None, None)
