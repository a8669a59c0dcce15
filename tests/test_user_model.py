"coreinv on a user's own model (issue 23): residual writes on both routes, folders without a tokenizer."
import copy
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")     # nothing here may reach the hub

import pytest
import torch

from coreinv.hooks import record_activation, replace_activation
from coreinv.ace import ACE
from coreinv.calibration import collect_triples
from coreinv.compare import projector_overlap
from coreinv.models import ARCHS, ROUTES, load_local, tiny_local_model
from helpers import LazyModels

N_LAYERS = 3
TOKENS = torch.randint(0, 320, (4, 8), generator=torch.Generator().manual_seed(0))   # [batch, pos]
# The hooks the docs call residual hooks: the stream before, between and after attention and MLP.
RESIDUAL_HOOKS = [f"blocks.{l}.hook_resid_{w}" for l in range(N_LAYERS) for w in ("pre", "mid", "post")]


def _load(folder, route):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return load_local(folder, route=route, device="cpu")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    return {arch: tiny_local_model(arch, root / arch, n_layers=N_LAYERS) for arch in ARCHS}


@pytest.fixture(scope="module")
def models(folders):
    return LazyModels(_load, folders)


def _edit(act):
    "A write that changes every coordinate: scale, shift, and a rotation of the last axis."
    return 0.5 * act.roll(1, -1) + 1.0


@pytest.mark.parametrize("arch", ARCHS)
def test_residual_hooks_read_and_write_alike_on_both_routes(models, arch):
    "Item 1: writing at blocks.L.hook_resid_mid on the bridge edited only the MLP input."
    bridge, hooked = models[arch, "bridge"], models[arch, "hooked"]
    with torch.no_grad():
        intact = bridge(TOKENS)
        for hook in RESIDUAL_HOOKS:
            reads = [record_activation(m, hook, TOKENS)[0] for m in (bridge, hooked)]
            assert torch.allclose(reads[0], reads[1], atol=1e-5), hook
            outs = []
            for m in (bridge, hooked):
                with replace_activation(m, hook, _edit):
                    outs.append(m(TOKENS))
            assert not torch.allclose(outs[0], intact, atol=1e-3), hook             # the write did something
            assert torch.allclose(outs[0], outs[1], atol=1e-4), (hook, float((outs[0] - outs[1]).abs().max()))
            # a zero write at resid_mid: the next block sees zeros plus the MLP's output, as on the hooked route
            with replace_activation(bridge, hook, torch.zeros_like):
                z = record_activation(bridge, hook.replace("hook_resid_mid", "hook_resid_post"), TOKENS)[0]
            with replace_activation(hooked, hook, torch.zeros_like):
                zh = record_activation(hooked, hook.replace("hook_resid_mid", "hook_resid_post"), TOKENS)[0]
            assert torch.allclose(z, zh, atol=1e-5), hook
    # ln2.hook_in keeps the bridge's own meaning: the MLP's input only, the residual untouched
    with torch.no_grad(), replace_activation(bridge, "blocks.1.ln2.hook_in", _edit):
        only_mlp = bridge(TOKENS)
    with torch.no_grad(), replace_activation(bridge, "blocks.1.hook_resid_mid", _edit):
        stream = bridge(TOKENS)
    assert not torch.allclose(only_mlp, stream, atol=1e-3)


def test_ace_at_resid_mid_agrees_across_routes(models):
    "Item 1: ACE fitted through a write at hook_resid_mid (σ₁ 1.47 rank 4 vs 3.26 rank 6 before)."
    readout = lambda logits: logits[:, -1].log_softmax(-1)
    fits = [ACE().fit_hook(models["gpt2", r], TOKENS, "blocks.1.hook_resid_mid", readout, pos=-1,
                           progress=False) for r in ROUTES]
    assert fits[0].rank_ == fits[1].rank_
    assert torch.allclose(fits[0].singular_values_, fits[1].singular_values_, rtol=1e-3)
    assert projector_overlap(fits[0].basis_, fits[1].basis_) > 1 - 1e-4


def test_bridge_with_resid_mid_point_deepcopies(models):
    "The resid_mid hooks hold no closures: a copy's hooks act on the copy's own hook point."
    original = models["llama", "bridge"]
    bridge = copy.deepcopy(original)
    assert bridge.hook_dict["blocks.1.hook_resid_mid"] is not original.hook_dict["blocks.1.hook_resid_mid"]
    with torch.no_grad():
        with replace_activation(bridge, "blocks.1.hook_resid_mid", _edit):
            a = bridge(TOKENS)
        with replace_activation(original, "blocks.1.hook_resid_mid", _edit):
            b = original(TOKENS)
    assert torch.allclose(a, b, atol=1e-6)


def _without_tokenizer(folder, dest):
    dest.mkdir()
    for f in folder.iterdir():
        if f.name in ("config.json", "model.safetensors", "generation_config.json"):
            (dest / f.name).write_bytes(f.read_bytes())
    return dest


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("route", ROUTES)
def test_folder_without_tokenizer_runs_on_ids_and_refuses_text(folders, models, tmp_path, arch, route):
    "Items 2 and 7: no empty tokenizer, no hub error, no sentencepiece request; text gets a ValueError."
    bare = _without_tokenizer(folders[arch], tmp_path / f"bare-{arch}")
    m = _load(bare, route)                                            # llama asked for sentencepiece, hooked for the hub
    assert m.tokenizer is None
    with torch.no_grad():
        assert torch.allclose(m(TOKENS), models[arch, route](TOKENS), atol=1e-6)   # token ids work
    for call in (lambda: m.to_tokens("hello world"), lambda: m.to_str_tokens("hello world")):
        with pytest.raises(ValueError, match="has no tokenizer.*pass token ids"):
            call()
    with pytest.raises(ValueError, match="no tokenizer"):
        collect_triples(m, ["the cat sat", "a dog ran"], positions=[-1])  # gave two identical rows
    data = collect_triples(m, TOKENS[:2], positions=[-1])
    assert data.X.shape[1] == 2


# -- ablate at the attention pattern (items 3 and 9), one-argument metrics (item 10) ------------------
from coreinv.ablate import ablate, hook_evaluator, random_core   # noqa: E402


def _tiny_hooked(n_heads=4, n_ctx=8):
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=n_ctx, d_head=4, n_heads=n_heads,
                                      d_vocab=10, act_fn="relu", seed=0)
        return HookedTransformer(cfg).eval()


def test_ablate_at_hook_pattern_edits_the_query_position_when_pos_equals_heads():
    "Item 3: 4 tokens, 4 heads: head 3 was edited at every query instead of query -1 in every head."
    model, hook = _tiny_hooked(n_heads=4), "blocks.0.attn.hook_pattern"
    tokens = torch.randint(0, 10, (3, 4), generator=torch.Generator().manual_seed(1))   # T = n_heads = 4
    pat = record_activation(model, hook, tokens)[0]                                       # [batch, head, q, k]
    core = random_core(4 * 4, 5, torch.full((16,), 0.25), seed=2)                         # D = n_heads·key_pos
    with ablate(model, hook, core, "remove", pos=-1):
        new = record_activation(model, hook, tokens)[0]
    assert torch.equal(new[:, :, :-1], pat[:, :, :-1])                                    # other queries untouched
    expected = core.remove(pat[:, :, -1].reshape(3, 16).double()).reshape(3, 4, 4)        # [head, key] of query -1
    assert torch.allclose(new[:, :, -1].double(), expected, atol=1e-6)


@pytest.mark.parametrize("route", ROUTES)
def test_core_fitted_at_hook_pattern_validates_with_ablate(models, route):
    "Item 9: fit_hook flattened [head, key], ablate [query, key] (D = 144 vs d = 48): now both [head, key]."
    model, hook = models["gpt2", route], "blocks.1.attn.hook_pattern"
    readout = lambda logits: logits[:, -1].log_softmax(-1)
    ace = ACE(n_components=3).fit_hook(model, TOKENS, hook, readout, pos=-1, progress=False)
    assert ace.core().d == 4 * TOKENS.shape[1]                                            # n_heads · key_pos
    pat = record_activation(model, hook, TOKENS)[0]
    with ablate(model, hook, ace.core(), "keep", pos=-1):
        kept = record_activation(model, hook, TOKENS)[0]
    flat = pat.movedim(2, 1)[:, -1].reshape(len(TOKENS), -1)                              # [batch, head·key]
    assert torch.allclose(kept.movedim(2, 1)[:, -1].reshape(len(TOKENS), -1),
                          ace.core().keep(flat), atol=1e-5)
    metric = lambda logits: float(logits[:, -1].log_softmax(-1).mean())
    ev = hook_evaluator(model, hook, TOKENS, metric, pos=-1)
    assert ev(ace.core(), "keep") == pytest.approx(ev(ace.core(), "keep"))               # runs, deterministic


def test_ablate_refuses_masked_attention_scores_on_both_routes(models):
    "Item 9: the bridge's scores hold -3.4e38 where masked, the hooked route -inf: both are refused."
    from coreinv.ablate import mean_core
    for route in ROUTES:
        core = mean_core(torch.zeros(4 * TOKENS.shape[1]))
        with pytest.raises(ValueError, match="masked entries.*hook_pattern"):
            with ablate(models["gpt2", route], "blocks.0.attn.hook_attn_scores", core, "keep", pos=-1):
                models["gpt2", route](TOKENS)


def test_hook_evaluator_takes_a_one_argument_metric():
    "Item 10: TransformerLens-style metric(logits) raised TypeError."
    model, hook = _tiny_hooked(), "blocks.0.hook_resid_post"
    tokens = torch.randint(0, 10, (5, 6), generator=torch.Generator().manual_seed(3))
    one = hook_evaluator(model, hook, tokens, lambda logits: logits[:, -1].log_softmax(-1).max(-1).values.mean())
    two = hook_evaluator(model, hook, tokens, lambda logits, x: logits[:, -1].log_softmax(-1).max(-1).values.mean())
    core = random_core(16, 3, torch.zeros(16))
    assert one(None) == two(None) and one(core, "remove") == two(core, "remove")
    with pytest.raises(ValueError, match="metric must be a callable"):
        hook_evaluator(model, hook, tokens, "loss")


def test_mean_core_is_the_chance_baseline():
    "The helper the guide uses instead of Core(torch.zeros(d, 0), mean)."
    from coreinv.ablate import mean_core
    model, hook = _tiny_hooked(), "blocks.0.hook_resid_post"
    tokens = torch.randint(0, 10, (5, 6), generator=torch.Generator().manual_seed(4))
    acts = record_activation(model, hook, tokens)[0]
    mean = acts.reshape(-1, 16).mean(0)
    c = mean_core(mean)
    assert (c.k, c.d) == (0, 16)
    with ablate(model, hook, c, "keep"):
        kept = record_activation(model, hook, tokens)[0]
    assert torch.allclose(kept, mean.expand_as(kept), atol=1e-6)
    with ablate(model, hook, c, "remove"):
        assert torch.allclose(record_activation(model, hook, tokens)[0], acts, atol=1e-6)
    for bad in (torch.zeros(2, 3), torch.tensor([1.0, float("nan")])):
        with pytest.raises(ValueError, match="mean must be a finite 1-D vector"):
            mean_core(bad)


# -- ACE on activations with a large mean (item 5) ---------------------------------------------------
@pytest.mark.parametrize("shift,float64", [(50.0, False), (400.0, False), (400.0, True), (1e4, False)])
def test_ace_fits_float32_activations_with_an_outsized_coordinate(shift, float64):
    "Item 5: +50 on one coordinate was refused by a round-off check that blamed partial_fit."
    g = torch.Generator().manual_seed(5)
    acts = 0.1 * torch.randn(512, 24, generator=g)                       # a small spread per coordinate
    acts[:, 3] += shift                                                   # a real model's outsized dimension
    W = torch.randn(24, 6, generator=g)
    W[3] = 0.0                                                            # the outsized coordinate is not read
    outputs = lambda h: torch.tanh(h @ W.to(h.dtype) / 30)                # [n, 6]
    got = ACE(float64=float64).fit(acts, outputs)
    ref = ACE(float64=True).fit(acts.double(), outputs)
    # the leading directions (the round-off floor decides the last, tiny singular values' rank cut)
    assert torch.allclose(got.singular_values_[:3].double(), ref.singular_values_[:3], rtol=1e-3)
    assert projector_overlap(got.core(3).basis, ref.core(3).basis) > 1 - 1e-4


def test_ace_still_refuses_a_wrong_mean_in_partial_fit():
    "The check stays where the data cannot be fitted: a first partial_fit centred away from the data."
    g = torch.Generator().manual_seed(6)
    acts = torch.randn(256, 8, generator=g) + 50
    f = lambda h: torch.tanh(h - 50)
    ace = ACE().partial_fit(acts[:128], f, mean=acts.mean(0).double() + 0.1)
    ace.partial_fit(acts[128:], f)
    with pytest.raises(ValueError, match="centred .* away from the data's mean.*mean="):
        ace.finalize()


def test_fit_hook_refuses_masked_attention_scores_on_both_routes(models):
    "Item 9: the hooked route refused hook_attn_scores (-inf), the bridge (-3.4e38) fitted it."
    readout = lambda logits: logits[:, -1].log_softmax(-1)
    for route in ROUTES:
        with pytest.raises(ValueError, match="holds -inf where the causal mask.*hook_pattern"):
            ACE().fit_hook(models["gpt2", route], TOKENS, "blocks.0.attn.hook_attn_scores", readout, pos=-1,
                           progress=False)


def test_dir_coreinv_shows_only_public_names():
    "The way in: dir(coreinv) listed sys, types, importlib and TYPE_CHECKING."
    import coreinv
    names = set(dir(coreinv))
    assert not {"sys", "types", "importlib", "TYPE_CHECKING"} & names, names
    assert {"ACE", "EDMDc", "load_local", "mean_core", "__version__"} <= names
    assert all(not n.startswith("_") or n == "__version__" for n in names), names
