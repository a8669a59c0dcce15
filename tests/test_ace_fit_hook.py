"ACE.fit_hook: the one-pass JVPs (from the hook on, every position at once) against the plain whole-model JVP, and its input checks."
import inspect
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from torch.func import jvp

import coreinv._hookplan
import coreinv.hooks
from coreinv.base import Core
from coreinv.hooks import record_activation, replace_activation
from coreinv.ace import ACE

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        cfg = HookedTransformerConfig(n_layers=3, d_model=16, n_ctx=6, d_head=4, n_heads=4, d_mlp=32, d_vocab=11,
                                      act_fn="gelu", seed=0, dtype=F64)
        return HookedTransformer(cfg).eval()


TOKENS = torch.randint(0, 11, (10, 6), generator=torch.Generator().manual_seed(1))
per_pos = lambda logits, x: logits.log_softmax(-1)[..., :4]              # [b, pos, 4]
per_seq = lambda logits: logits[:, -1].log_softmax(-1)[:, :5]             # [b, 5]


def whole_model_jvp(model, tokens, hook, readout, pos):
    """σ and basis of M = (1/N) Σ h̃ (J h̃)ᵀ, each position's JVP through the *whole* model with the activation
    replaced at that position (the plain form fit_hook had before it started at the hook)."""
    with torch.no_grad():
        return _whole_model_jvp(model, tokens, hook, readout, pos)


def _whole_model_jvp(model, tokens, hook, readout, pos):
    acts, _ = record_activation(model, hook, tokens)                      # [b, T, ...]
    T = acts.shape[1]
    ts = range(T) if pos is None else [pos % T]
    H = torch.cat([acts[:, t].reshape(len(tokens), -1) for t in ts]).double()
    mean = H.mean(0)
    M = 0
    for t in ts:
        h = acts[:, t].reshape(len(tokens), -1).double()
        def f(z, t=t):
            def sub(act):
                mask = torch.zeros(T, dtype=torch.bool); mask[t] = True
                return torch.where(mask.view(1, T, *[1] * (act.ndim - 2)), z.reshape(act[:, t].shape).unsqueeze(1), act)
            with replace_activation(model, hook, sub):
                out = model(tokens)
            y = readout(out, tokens) if readout is per_pos else readout(out)
            y = y[:, t] if y.ndim == 3 else y
            return y - y.mean(-1, keepdim=True)
        v = jvp(f, (h,), (h - mean,))[1]
        M = M + (h - mean).T @ v
    U, S, _ = torch.linalg.svd(M / len(H), full_matrices=False)
    r = int((S > 100 * torch.finfo(F64).eps * S[0]).sum())
    return S[:r], U[:, :r]


def _spy(monkeypatch, name):
    calls = []
    orig = getattr(coreinv._hookplan, name)
    def wrapped(*a, **kw):
        calls.append(name)
        return orig(*a, **kw)
    monkeypatch.setattr(coreinv._hookplan, name, wrapped)
    return calls


@pytest.mark.parametrize("hook", ["blocks.0.hook_resid_post", "blocks.1.hook_resid_pre", "blocks.1.attn.hook_z",
                                  "blocks.1.hook_resid_mid", "blocks.2.hook_resid_post", "hook_embed"])
@pytest.mark.parametrize("pos,readout", [(-1, per_pos), (2, per_seq), (None, per_pos), (None, per_seq)],
                         ids=["pos-1", "pos2-seq", "all-perpos", "all-perseq"])
def test_matches_whole_model_jvp(model, hook, pos, readout):
    if hook == "blocks.2.hook_resid_post" and pos == 2 and readout is per_seq:
        pytest.skip("position 2 after the last attention cannot reach the last position's readout")
    ace = ACE(batch_size=4, float64=True).fit_hook(model, TOKENS, hook, readout, pos=pos, progress=False)
    S, U = whole_model_jvp(model, TOKENS, hook, readout, pos)
    assert ace.rank_ == len(S)
    assert float((ace.singular_values_ - S).abs().max()) <= 1e-10 * float(S[0])
    assert float((ace.basis_ @ ace.basis_.T - U @ U.T).abs().max()) <= 1e-10


def test_paths_taken(model, monkeypatch):
    "Which one-pass form each case uses: start at the hook, the diagonal form, vmap over positions, joint."
    used = []
    orig = coreinv._hookplan._HookPlan.use_diagonal
    monkeypatch.setattr(coreinv._hookplan._HookPlan, "use_diagonal", lambda self, *a: used.append(orig(self, *a)) or used[-1])
    vm = _spy(monkeypatch, "vmap")
    a = ACE(batch_size=5, float64=True).fit_hook(model, TOKENS, "blocks.0.hook_resid_post", per_pos, progress=False)
    assert used == [True] and not a.joint_                 # one pass with each position's tangent apart
    used.clear(); vm.clear()
    ACE(batch_size=5, float64=True).fit_hook(model, TOKENS, "blocks.0.hook_resid_post", per_seq, progress=False)
    assert used == [False] and len(vm) >= 2                # a [b, O] readout: the T tangents vmapped, per batch
    assert ACE(batch_size=5).fit_hook(model, TOKENS, "blocks.2.hook_resid_post", per_pos, progress=False).joint_
    assert coreinv.hooks._start_at(model, "blocks.1.hook_resid_post") == (2, None)
    assert coreinv.hooks._start_at(model, "blocks.1.attn.hook_z") == (1, "blocks.1.hook_resid_pre")
    assert coreinv.hooks._start_at(model, "hook_embed") is None


def test_bridge_route_falls_back_to_the_whole_model(tmp_path):
    "TransformerBridge has no start_at_layer: the whole model runs, with the same result as the hooked route."
    from coreinv.models import load_local, tiny_local_model
    folder = tiny_local_model("gpt2", tmp_path / "gpt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        bridge, hooked = (load_local(folder, route=r, device="cpu", dtype=F64) for r in ("bridge", "hooked"))
    assert coreinv.hooks._start_at(bridge, "blocks.0.hook_resid_post") is None
    tok = torch.randint(0, 320, (6, 8), generator=torch.Generator().manual_seed(0))
    read = lambda logits, x: logits.log_softmax(-1)[..., :4]
    for pos in (-1, None):
        fits = [ACE(float64=True).fit_hook(m, tok, "blocks.0.hook_resid_post", read, pos=pos, progress=False)
                for m in (bridge, hooked)]
        S, _ = whole_model_jvp(hooked, tok, "blocks.0.hook_resid_post", per_pos, pos)
        for f in fits:
            assert f.rank_ == len(S) and float((f.singular_values_ - S).abs().max()) <= 1e-9 * float(S[0])


# ---- issue 23: the defaults and the input checks -------------------------------------------------

def test_pos_none_with_a_per_sequence_readout_falls_back(model):
    "pos=None, joint not passed, a [b] or [b, O] readout: per position, as documented (not a joint=True error)."
    for read in (per_seq, lambda logits: logits[:, -1, 0] - logits[:, -1, 1]):
        a = ACE(float64=True).fit_hook(model, TOKENS, "blocks.0.hook_resid_post", read, progress=False)
        b = ACE(float64=True).fit_hook(model, TOKENS, "blocks.0.hook_resid_post", read, joint=False, progress=False)
        assert not a.joint_ and torch.allclose(a.singular_values_, b.singular_values_, rtol=1e-10)
    with pytest.raises(ValueError, match="per-position readout"):
        ACE().fit_hook(model, TOKENS, "blocks.2.hook_resid_post", per_seq, joint=True)


@pytest.mark.parametrize("bad,match", [
    (TOKENS.double(), "not ids"),
    (TOKENS + 11, "outside the vocabulary 0..10"),
    (-TOKENS - 1, "outside the vocabulary"),
    (torch.zeros(4, 6, dtype=torch.long, device="meta"), "meta device"),
    (torch.zeros(2, 9, dtype=torch.long), "n_ctx=6"),
    (TOKENS[0], r"\[batch, pos\]"),
])
def test_tokens_are_validated(model, bad, match):
    with pytest.raises(ValueError, match=match):
        ACE().fit_hook(model, bad, "blocks.0.hook_resid_post", per_pos, pos=-1, progress=False)
    with pytest.raises(ValueError, match=match):                          # the same check, batch by batch
        ACE().fit_hook(model, [TOKENS[:4], bad], "blocks.0.hook_resid_post", per_pos, pos=-1, progress=False)


def test_model_on_the_meta_device_is_refused():
    with torch.device("meta"):
        m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with pytest.raises(ValueError, match="meta device"):
        ACE().fit_hook(m, torch.randn(20, 4), "1", lambda out, x: out, progress=False)


def test_core_takes_numpy_and_a_bfloat16_basis():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3000, 64, generator=g)
    W = torch.randn(64, 32, generator=g)
    fit = ACE().fit(X.bfloat16(), lambda x: torch.tanh(x @ W.to(x.dtype)))
    assert fit.basis_.dtype == torch.bfloat16
    err = (fit.basis_.double().T @ fit.basis_.double() - torch.eye(fit.rank_, dtype=F64)).abs().max()
    assert err > 1e-5                                         # bfloat16 rounding: not orthonormal to 1e-5
    core = Core(fit.basis_, fit.mean_)                        # yet accepted, and orthonormalised
    assert (core.basis.T @ core.basis - torch.eye(core.k, dtype=F64)).abs().max() < 1e-12
    assert (core.basis.T @ fit.basis_.double()).pow(2).sum() / core.k > 1 - 1e-4      # the same span
    h = np.random.default_rng(0).normal(size=(5, 64))
    for f in (core.keep, core.remove, core.coords):
        out = f(h)
        assert isinstance(out, torch.Tensor) and out.dtype == F64
        assert torch.allclose(out, f(torch.as_tensor(h)))
    with pytest.raises(ValueError, match="orthonormal"):
        Core(torch.randn(64, 3, generator=g), torch.zeros(64))


def test_rank_note_for_a_scalar_readout():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(500, 8, generator=g, dtype=F64)
    fit = ACE().fit(X, lambda x: x[:, 0] - x[:, 1])            # a logit-difference-like scalar readout
    assert fit.rank_ == 1
    with pytest.raises(ValueError, match=r"at most the number of outputs.*method='gramian'"):
        fit.core(2)
    doc = inspect.getdoc(ACE.fit_hook)
    assert "at most the number of outputs" in doc and 'method="gramian"' in doc
    assert "float32" in inspect.getdoc(ACE) and "rank_" in inspect.getdoc(ACE)


def test_first_pass_shows_progress(model, capsys):
    ACE().fit_hook(model, TOKENS, "blocks.0.hook_resid_post", per_pos, pos=-1)
    err = capsys.readouterr().err
    assert "ACE.fit_hook: mean" in err and "ACE.fit_hook:" in err.replace("ACE.fit_hook: mean", "")


def test_diagonal_form_on_rotary_grouped_query_attention(tmp_path, monkeypatch):
    "Llama's layout (rotary, two key/value heads for four query heads): the diagonal form holds and is exact."
    from coreinv.models import load_local, tiny_local_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        m = load_local(tiny_local_model("llama", tmp_path / "llama"), route="hooked", device="cpu", dtype=F64)
    assert m.cfg.positional_embedding_type == "rotary" and m.cfg.n_key_value_heads < m.cfg.n_heads
    used = []
    orig = coreinv._hookplan._HookPlan.use_diagonal
    monkeypatch.setattr(coreinv._hookplan._HookPlan, "use_diagonal", lambda self, *a: used.append(orig(self, *a)) or used[-1])
    tok = torch.randint(0, 320, (6, 8), generator=torch.Generator().manual_seed(0))
    a = ACE(float64=True).fit_hook(m, tok, "blocks.0.hook_resid_pre", per_pos, progress=False)
    S, U = whole_model_jvp(m, tok, "blocks.0.hook_resid_pre", per_pos, None)
    assert used == [True] and a.rank_ == len(S)
    assert float((a.singular_values_ - S).abs().max()) <= 1e-10 * float(S[0])
    assert float((a.basis_ @ a.basis_.T - U @ U.T).abs().max()) <= 1e-10


# -- from the review of the one-pass forms ------------------------------------------------------------------
mixes_rows = lambda logits: logits[:, -1].log_softmax(0)[:, :5]          # normalised over the batch: rows interact


@pytest.mark.parametrize("method", ["jvp", "gramian"])
def test_a_readout_that_mixes_rows_is_refused_by_both_methods(model, method):
    with pytest.raises(ValueError, match="rows|batch"):
        ACE(method=method, batch_size=10, float64=True).fit_hook(model, TOKENS, "blocks.1.hook_resid_post",
                                                                 mixes_rows, progress=False)


def test_the_exactness_check_has_a_tolerance_that_can_fail_in_half_precision():
    tol = coreinv._hookplan._exact_tol
    assert tol(torch.float64) == 1000 * torch.finfo(torch.float64).eps
    assert tol(torch.bfloat16) == tol(torch.float16) == 1e-2          # 1000 ε would be 7.8 and 0.98


def test_pos_none_at_the_attention_input_hooks_matches_the_whole_model(monkeypatch):
    "hook_attn_in sits before its block's attention: the diagonal form starts there, and is found exact."
    used = []
    orig = coreinv._hookplan._HookPlan.use_diagonal
    monkeypatch.setattr(coreinv._hookplan._HookPlan, "use_diagonal", lambda self, *a: used.append(orig(self, *a)) or used[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=6, d_head=4, n_heads=4, d_mlp=32, d_vocab=11,
                                      act_fn="gelu", seed=0, dtype=F64, use_attn_in=True)
        m = HookedTransformer(cfg).eval()
    for hook in ("blocks.0.hook_attn_in", "blocks.1.hook_attn_in"):
        ace = ACE(batch_size=5, float64=True).fit_hook(m, TOKENS, hook, per_pos, pos=None, progress=False)
        s, B = whole_model_jvp(m, TOKENS, hook, per_pos, None)
        k = min(4, len(s))
        np.testing.assert_allclose(ace.singular_values_[:k].numpy(), s[:k], rtol=1e-8, atol=1e-12)
    assert used == [True, True], "the one-pass form was exact at both hooks"
