"coreinv on a user's own model (issue 23): residual writes on both routes, folders without a tokenizer."
import copy
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")     # nothing here may reach the hub

import pytest
import torch

from coreinv.ace import ACE, record_activation, replace_activation
from coreinv.calibration import collect_triples
from coreinv.compare import projector_overlap
from coreinv.models import ARCHS, ROUTES, load_local, tiny_local_model

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
    return {(arch, route): _load(folders[arch], route) for arch in ARCHS for route in ROUTES}


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
