"models: load_local on both TransformerLens routes, and the library on each (tiny random GPT-2, Llama, Qwen2)."
import json
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")     # nothing here may reach the hub

import numpy as np
import pytest
import torch

from coreinv.ablate import ablate, hook_evaluator, random_core
from coreinv.hooks import hook_names, record_activation, replace_activation
from coreinv.ace import ACE
from coreinv.calibration import check_update, collect_triples, mlp_map
from coreinv.compare import projector_overlap, weight_cosine
from coreinv.dictionaries import PCADictionary
from coreinv.koopman import EDMDc
from coreinv.models import ARCHS, HOOKED_ARCHITECTURES, ROUTES, load_local, tiny_local_model
from helpers import LazyModels

TOKENS = torch.randint(0, 320, (6, 12), generator=torch.Generator().manual_seed(0))   # [batch, pos]
# The names coreinv's functions use, all TransformerLens's own.
HOOKS = ("hook_embed", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_z", "blocks.0.hook_attn_out",
         "blocks.0.hook_resid_mid", "blocks.0.mlp.hook_post", "blocks.0.hook_mlp_out",
         "blocks.1.hook_resid_post", "blocks.0.attn.hook_pattern")
readout = lambda logits, x: logits[:, -1].log_softmax(-1)                # [batch, d_vocab]


def _load(folder, route):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)             # the hooked route's; tested below
        return load_local(folder, route=route, device="cpu")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    # Folder names with "llama" in them: TransformerLens would guess the architecture from the name.
    return {arch: tiny_local_model(arch, root / f"llama-like-{arch}") for arch in ARCHS}


@pytest.fixture(scope="module")
def models(folders):
    return LazyModels(_load, folders)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(folders, models, arch):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(folders[arch], attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(TOKENS).logits                                          # [batch, pos, d_vocab]
        for route in ROUTES:
            diff = float((models[arch, route](TOKENS) - ref).abs().max())
            print(f"{arch:6s} {route:6s} max |logits - transformers| = {diff:.2e}")
            assert diff < 1e-5, (arch, route, diff)


def test_routes_return_the_promised_types(models):
    from transformer_lens import HookedTransformer
    from transformer_lens.model_bridge import TransformerBridge
    for arch in ARCHS:
        assert isinstance(models[arch, "bridge"], TransformerBridge)
        assert isinstance(models[arch, "hooked"], HookedTransformer)
        assert not models[arch, "bridge"].training and not models[arch, "hooked"].training
        assert models[arch, "bridge"].tokenizer is not None


def test_tiny_local_model_is_seeded(tmp_path):
    from safetensors.torch import load_file
    a, b, c = (load_file(tiny_local_model("qwen2", tmp_path / n, seed=s) / "model.safetensors")
               for n, s in (("a", 0), ("b", 0), ("c", 1)))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.self_attn.q_proj.weight"], c["model.layers.0.self_attn.q_proj.weight"])
    with pytest.raises(ValueError, match="arch"):
        tiny_local_model("bert", tmp_path / "d")


def test_tokenizer_survives_both_routes(folders, models):
    "AutoTokenizer (which TransformerLens reloads) picks Qwen2Tokenizer for Qwen2; the ids must not change."
    from coreinv.models import tiny_tokenizer
    text = "the cat sat on the mat, then they went home?"
    ids = tiny_tokenizer()(text).input_ids
    for arch, route in [(a, r) for a in ARCHS for r in ROUTES]:
        m = models[arch, route]
        got = m.to_tokens(text, prepend_bos=False)[0].tolist()
        assert got == ids, (arch, route)


def test_errors_name_the_folder_and_what_is_missing(tmp_path, folders):
    with pytest.raises(ValueError, match="is not a folder"):
        load_local(tmp_path / "absent")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"no config.json and no weights.*notes.txt"):
        load_local(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match=rf"{tmp_path.name}.*has no weights"):
        load_local(tmp_path)
    with pytest.raises(ValueError, match="route must be one of"):
        load_local(folders["gpt2"], route="auto")


def test_hooked_route_lists_supported_architectures(tmp_path, folders):
    cfg = json.loads((folders["gpt2"] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"architectures": ["FancyNewForCausalLM"]}))
    (tmp_path / "model.safetensors").write_bytes((folders["gpt2"] / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=r"FancyNewForCausalLM.*Supported: GPT2LMHeadModel.*route='bridge'"):
        load_local(tmp_path, route="hooked")
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"n_inner": 3 * cfg["n_embd"]}))
    with pytest.raises(ValueError, match="n_inner"):
        load_local(tmp_path, route="hooked")
    assert {"GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM"} <= set(HOOKED_ARCHITECTURES)


def test_deprecation_warning_comes_from_the_hooked_route_only(folders):
    for route, expected in (("bridge", []), ("hooked", [DeprecationWarning])):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            load_local(folders["llama"], route=route, device="cpu")
        assert [w.category for w in caught] == expected, [str(w.message) for w in caught]


@pytest.mark.parametrize("arch", ARCHS)
def test_same_hook_names_and_activations(models, arch):
    bridge, hooked = models[arch, "bridge"], models[arch, "hooked"]
    assert set(hook_names(hooked)) <= set(hook_names(bridge))
    for hook in HOOKS:
        a, _ = record_activation(bridge, hook, TOKENS)
        b, _ = record_activation(hooked, hook, TOKENS)
        # per-head hooks: the bridge carries [batch, pos, n_heads·d_head], HookedTransformer [..., n_heads, d_head]
        assert a.numel() == b.numel() and torch.allclose(a.reshape(b.shape), b, atol=1e-6), hook
    # replace_activation intervenes identically
    zero = lambda act: torch.zeros_like(act)
    with torch.no_grad():
        outs = []
        for m in (bridge, hooked):
            with replace_activation(m, "blocks.0.hook_attn_out", zero):
                outs.append(m(TOKENS))
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    assert not torch.allclose(outs[0], bridge(TOKENS), atol=1e-5)        # the intervention did something


@pytest.mark.parametrize("arch", ARCHS)
def test_ace_and_ablate_match_across_routes(models, arch):
    bridge, hooked = models[arch, "bridge"], models[arch, "hooked"]
    for hook in ("blocks.0.hook_resid_post", "blocks.0.attn.hook_z", "blocks.1.hook_mlp_out"):
        fits = [ACE(n_components=4).fit_hook(m, TOKENS, hook, readout, pos=-1) for m in (bridge, hooked)]
        assert fits[0].rank_ == fits[1].rank_ == 4
        assert torch.allclose(fits[0].singular_values_, fits[1].singular_values_, rtol=1e-4), hook
        assert projector_overlap(fits[0].basis_, fits[1].basis_) > 1 - 1e-5, hook
        core = fits[0].core(2)
        metric = lambda logits, x: float(logits[:, -1].log_softmax(-1).mean())
        for mode in ("keep", "remove"):
            with torch.no_grad():
                out = []
                for m in (bridge, hooked):
                    with ablate(m, hook, core, mode, pos=-1):
                        out.append(m(TOKENS))
            assert torch.allclose(out[0], out[1], atol=1e-5), (hook, mode)
            ev = [hook_evaluator(m, hook, TOKENS, metric, pos=-1)(core, mode) for m in (bridge, hooked)]
            assert abs(ev[0] - ev[1]) < 1e-5, (hook, mode, ev)


@pytest.mark.parametrize("arch", ARCHS)
def test_calibration_and_edmdc_match_across_routes(models, arch):
    bridge, hooked = models[arch, "bridge"], models[arch, "hooked"]
    data = [collect_triples(m, TOKENS, positions=[-2, -1]) for m in (bridge, hooked)]
    for a, b in zip((data[0].X, data[0].U, data[0].Y), (data[1].X, data[1].U, data[1].Y)):
        assert a.shape == (2, 12, 32) and np.allclose(a, b, atol=1e-6)
    for m in (bridge, hooked):
        dev = check_update(m, TOKENS)
        assert set(dev) == {0, 1} and max(dev.values()) < 1e-5, dev     # x_{l+1} = x + u + m(x + u)
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(mlp_map(bridge, 1)(x), mlp_map(hooked, 1)(x), atol=1e-6)
    full = [collect_triples(m, TOKENS) for m in (bridge, hooked)]            # 144 samples ≥ 9 + 32 unknowns
    fits = [EDMDc(dictionary=PCADictionary(8)).fit(*d.pooled()) for d in full]
    ev = [np.sort_complex(f.eigvals_) for f in fits]
    assert np.allclose(ev[0], ev[1], atol=1e-4), (ev[0], ev[1])


def test_generic_model_functions_take_a_bridge(folders):
    "weight_cosine and a random core's ablation need nothing beyond an nn.Module with TL hook names."
    a, b = _load(folders["gpt2"], "bridge"), _load(folders["gpt2"], "bridge")
    assert abs(weight_cosine(a, b) - 1) < 1e-9
    core = random_core(32, 3, torch.zeros(32))
    with torch.no_grad(), ablate(a, "blocks.0.hook_resid_post", core, "keep"):
        assert torch.isfinite(a(TOKENS)).all()


def _rotation_fixing_ones(D, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = torch.ones(D, 1, dtype=torch.float64) / D ** 0.5
    Q, _ = torch.linalg.qr(torch.cat([n, torch.randn(D, D - 1, generator=g, dtype=torch.float64)], 1))
    O, _ = torch.linalg.qr(torch.randn(D - 1, D - 1, generator=g, dtype=torch.float64))
    return n @ n.T + Q[:, 1:] @ O @ Q[:, 1:].T


def test_weight_surgery_needs_the_hooked_route(models):
    "fold_layernorm and rotate_residual edit HookedTransformer's weight layout: a bridge is refused clearly."
    from coreinv.merge import fold_layernorm, interpolate, rotate_residual
    bridge, hooked = models["gpt2", "bridge"], models["gpt2", "hooked"]
    with pytest.raises(ValueError, match="route='hooked'"):
        fold_layernorm(bridge)
    with pytest.raises(ValueError, match="route='hooked'"):
        rotate_residual(bridge, torch.eye(32))
    folded = fold_layernorm(hooked)                 # on the hooked route both work, and keep the function
    rotated = rotate_residual(folded, _rotation_fixing_ones(32))
    with torch.no_grad():
        ref = hooked(TOKENS).log_softmax(-1)
        assert torch.allclose(folded(TOKENS).log_softmax(-1), ref, atol=1e-5)
        assert torch.allclose(rotated(TOKENS).log_softmax(-1), ref, atol=1e-4)
        # interpolate is generic: a bridge halfway to itself is itself
        assert torch.allclose(interpolate(bridge, bridge, 0.5)(TOKENS), bridge(TOKENS), atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_float64_load(folders, arch):
    """dtype reaches the weights on both routes. In float64 the bridge matches transformers exactly; the hooked
    route is off by ~4e-8 on Llama and Qwen2 because TransformerLens computes rotary frequencies in float32."""
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(folders[arch], dtype=torch.float64, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(TOKENS).logits
        for route, tol in (("bridge", 1e-12), ("hooked", 1e-6)):
            m = _load_dtype(folders[arch], route, torch.float64)
            assert all(p.dtype == torch.float64 for p in m.parameters())
            diff = float((m(TOKENS) - ref).abs().max())
            print(f"float64 {arch:6s} {route:6s} max |logits - transformers| = {diff:.1e}")
            assert diff < tol, (arch, route, diff)


def _load_dtype(folder, route, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return load_local(folder, route=route, device="cpu", dtype=dtype)


def test_load_local_refuses_a_missing_or_broken_gguf_and_leaves_nothing(tmp_path, monkeypatch):
    "A .gguf path that is no file, or a file that is no GGUF, gets a ValueError naming it; no half-written folder stays."
    from coreinv.runtime import cache_dir
    monkeypatch.setenv("COREINV_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken.gguf"
    broken.write_text("not a model")
    for path, says in ((tmp_path / "absent.gguf", "no GGUF file at"), (broken, "GGUF")):
        with pytest.raises(ValueError, match=says) as e:
            load_local(path)
        assert str(path) in str(e.value)
    left = list(cache_dir("pretrained").iterdir()) if cache_dir("pretrained").exists() else []
    assert left == [], left
