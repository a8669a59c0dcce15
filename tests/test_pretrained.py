"""The packaged pretrained LMs against `transformers`' own GGUF loading, for both models: logits on held-out
text, greedy text through the bridge's KV cache, the first token, and the model cache's second load.
Slow (Gemma's dequantisation takes minutes on 2 cores): `make test` runs it beside the chapters."""
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from coreinv.models import _quiet_transformers
from coreinv.pretrained import PACKAGED, _concatenated, _progress, pretrained

MODULE = sys.modules["coreinv.pretrained"]        # (coreinv.pretrained is the function)
# Held-out text, written for this test and used by no fit
HELD_OUT = ("A small boat left the harbour before dawn. The fishermen on board had checked the nets twice, "
            "because the last storm had torn two of them, and the price of new rope was higher than ever.")


@pytest.fixture(scope="module", params=list(PACKAGED))
def loaded(request, tmp_path_factory):
    "(spec, coreinv's model, transformers' model read from the same GGUF file)"
    spec = PACKAGED[request.param]
    model = pretrained(spec.name, device="cpu")
    gguf = _concatenated(spec.files(), tmp_path_factory.mktemp(spec.name))
    with _quiet_transformers(), _progress():
        reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=torch.float32).eval()
    return spec, model, reference


def test_logits_equal_transformers_gguf_load(loaded):
    spec, model, reference = loaded
    tokens = model.to_tokens(HELD_OUT)                                   # [1, pos]
    assert model.to_str_tokens(tokens[0, :1]) == [spec.first_token]     # the document-start rule
    with torch.no_grad():
        diff = float((model(tokens) - reference(tokens).logits).abs().max())
    assert diff < 1e-4, (spec.name, diff)


def test_greedy_text_equals_transformers(loaded):
    spec, model, reference = loaded
    prompt = model.to_tokens("The keys to the old cabinet")              # [1, pos]
    with torch.no_grad():
        theirs = reference.generate(prompt, max_new_tokens=12, do_sample=False)[0]
    for kv in (True, False):
        ours = model.generate(prompt, max_new_tokens=12, do_sample=False, use_past_kv_cache=kv, verbose=False)[0]
        assert torch.equal(ours, theirs), (spec.name, kv, model.to_string(ours), model.to_string(theirs))


def test_a_second_load_reads_the_cache(loaded, monkeypatch):
    spec, model, _ = loaded
    def refuse(*args, **kwargs): raise AssertionError("converted again")
    monkeypatch.setattr(MODULE, "convert_gguf", refuse)
    again = pretrained(spec.name, device="cpu")
    tokens = model.to_tokens(HELD_OUT)
    with torch.no_grad():
        assert torch.equal(again(tokens), model(tokens))


def test_update_equation_holds_through_the_hooks(loaded):
    "x_{ℓ+1} = x_ℓ + u_ℓ + m(x_ℓ + u_ℓ) on every layer, m with Gemma's post-MLP norm (`mlp_map`); x + u alone is off."
    from coreinv.calibration import check_update, collect_triples
    spec, model, _ = loaded
    tokens = model.to_tokens(HELD_OUT)
    dev = check_update(model, tokens)
    assert len(dev) == model.cfg.n_layers and max(dev.values()) < 1e-5, (spec.name, dev)
    data = collect_triples(model, tokens, layers=[model.cfg.n_layers // 2])
    x, u, y = data.layer(model.cfg.n_layers // 2)
    # the MLP's share is not negligible: per row, not against the largest entry, which is the first token's
    # massive activation (SmolLM2's layer 15: 2e4, where the MLP writes 27 and elsewhere ~20% of a row's norm)
    share = np.linalg.norm(x + u - y, axis=1) / np.linalg.norm(y, axis=1)
    assert np.median(share) > 1e-2, (spec.name, np.median(share))
