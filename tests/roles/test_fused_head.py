"""The chunked LM head (``model.use_fused_kernels``) against the plain full-logits path.

Log-probs and entropies (fp32) equal the plain path's on every real response token, for the
padded and the padding-free forward and for chunk sizes that do and do not divide the number
of positions; the gradients of a loss through both outputs equal the plain path's for every
parameter, with tied and untied embeddings; FlowRL's forward gives the same log Z.  The
autograd Function itself passes ``gradcheck`` in float64 (bias included), and negative
controls show the comparisons can fail.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import left_padded_batch

from rlforge.batch import Batch
from rlforge.engine.packing import packed_response_log_probs
from rlforge.models.log_z import PolicyWithLogZ
from rlforge.roles.forward import response_log_probs, response_log_probs_with_log_z
from rlforge.roles.fused_head import ChunkedLinearLogProbs, fused_head_unsupported, head_log_probs

EOS = 2
R = 7
CHUNKS = [1, 3, 7, 4096]  # 23 real response tokens: 3 and 7 do not divide 23; 4096 = one chunk
PATHS = {"padded": response_log_probs, "packed": packed_response_log_probs}


def _model(tok, tied: bool = True, seed: int = 1):
    from rlforge.models import load_causal_lm

    return load_causal_lm("preset:tiny", tok, {"initializer_range": 0.2, "tie_word_embeddings": tied}, seed=seed)


@pytest.fixture(scope="module")
def batch(tiny_tokenizer):
    """5 rows: left-padded prompts of 1..6 tokens, responses with 1..7 real tokens (EOS at
    different places, one without EOS)."""
    b = left_padded_batch(tiny_tokenizer.pad_token_id, EOS, [3, 6, 1, 5, 2], [0, 6, 2, None, 4], R)
    assert b["response_mask"].sum(1).tolist() == [1, 7, 3, 7, 5]
    return b


def _weights(b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    mask = b["response_mask"].float()
    return torch.randn(mask.shape, generator=g) * mask, torch.rand(mask.shape, generator=g) * mask


def _loss_grads(model, fn, b: Batch, temperature: float, chunk: int, ent_weight: float = 0.3):
    """log-probs, entropy and the gradients of ``sum(a * logp) + ent_weight * sum(c * H)``."""
    model.zero_grad(set_to_none=True)
    a, c = _weights(b)
    logp, ent = fn(model, b, temperature, True, chunk_size=chunk)
    ((a * logp).sum() + ent_weight * (c * ent).sum()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_chunked_log_probs_equal_full_logits(tiny_tokenizer, batch, path, temperature, chunk):
    model = _model(tiny_tokenizer).eval()
    mask = batch["response_mask"].bool()
    fn = PATHS[path]
    with torch.no_grad():
        ref_lp, ref_ent = fn(model, batch, temperature, True)
        lp, ent = fn(model, batch, temperature, True, chunk_size=chunk)
    assert lp.shape == ref_lp.shape and lp.dtype == torch.float32 and ent.dtype == torch.float32
    torch.testing.assert_close(lp[mask], ref_lp[mask], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent[mask], ref_ent[mask], atol=1e-6, rtol=1e-6)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    assert ref_lp[mask].std() > 0.1 and ref_ent[mask].std() > 0.01  # informative values
    with torch.no_grad():
        _, none = fn(model, batch, temperature, False, chunk_size=chunk)
    assert none is None


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("path", list(PATHS))
def test_chunked_gradients_equal_full_logits(tiny_tokenizer, batch, tied, path):
    """Gradients through log-probs and entropy (the actor's entropy bonus) for every parameter."""
    model = _model(tiny_tokenizer, tied=tied).train()
    head, emb = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert (head is emb) == tied
    mask = batch["response_mask"].bool()
    ref_lp, ref_ent, ref_g = _loss_grads(model, PATHS[path], batch, 0.9, 0)
    assert len(ref_g) == len(list(model.parameters()))
    for chunk in (3, 5, 4096):
        lp, ent, g = _loss_grads(model, PATHS[path], batch, 0.9, chunk)
        torch.testing.assert_close(lp[mask], ref_lp[mask], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ent[mask], ref_ent[mask], atol=1e-6, rtol=1e-6)
        assert set(g) == set(ref_g)
        for name, ref in ref_g.items():
            scale = float(ref.abs().max())
            assert scale > 0, name
            torch.testing.assert_close(g[name], ref, atol=1e-5 * scale, rtol=1e-4, msg=name)


def test_entropy_gradient_is_exercised(tiny_tokenizer, batch):
    """Negative control: the entropy term changes the head's gradient by far more than the
    tolerance above, so a missing or wrong entropy gradient would fail the comparison."""
    model = _model(tiny_tokenizer).train()
    _, _, with_ent = _loss_grads(model, response_log_probs, batch, 0.9, 3, ent_weight=0.3)
    _, _, without = _loss_grads(model, response_log_probs, batch, 0.9, 3, ent_weight=0.0)
    name = "lm_head.weight" if "lm_head.weight" in with_ent else "model.embed_tokens.weight"
    diff = float((with_ent[name] - without[name]).abs().max())
    assert diff > 1e-2 * float(without[name].abs().max())


@pytest.mark.parametrize("with_bias", [False, True])
def test_function_gradcheck_float64(with_bias):
    """Analytic backward of both outputs against finite differences (float64, small shapes),
    temperature != 1, chunk size not dividing the rows."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True) if with_bias else None
    y = torch.randint(0, 11, (7,), generator=g)

    def f(h, w, b):
        return ChunkedLinearLogProbs.apply(h, w, b, y, 0.8, 3, True)

    assert torch.autograd.gradcheck(f, (h, w, b), eps=1e-6, atol=1e-7)
    # and the values: the textbook formulas on the full logits
    z = (h @ w.T + (b if b is not None else 0)) / 0.8
    lp, ent = f(h, w, b)
    torch.testing.assert_close(lp, torch.log_softmax(z, -1).gather(1, y[:, None])[:, 0])
    torch.testing.assert_close(ent, -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1))


def test_log_prob_gradient_alone(tiny_tokenizer, batch):
    """Only the log-probs used (entropy computed but not in the loss): same gradients."""
    model = _model(tiny_tokenizer).train()
    a, _ = _weights(batch)
    out = []
    for chunk in (0, 4):
        model.zero_grad(set_to_none=True)
        logp, _ = response_log_probs(model, batch, 1.0, True, chunk_size=chunk)
        (a * logp).sum().backward()
        out.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, ref in out[0].items():
        torch.testing.assert_close(out[1][name], ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-4, msg=name)


def test_flowrl_forward_equal(tiny_tokenizer, batch):
    """PolicyWithLogZ: the chunked forward gives the same log-probs, log Z and gradients."""
    torch.manual_seed(0)
    model = PolicyWithLogZ(_model(tiny_tokenizer), 16).train()
    torch.nn.init.normal_(model.log_z_head.net[-1].weight)  # a non-constant log Z
    mask = batch["response_mask"].bool()
    a, c = _weights(batch)
    results = []
    for chunk in (0, 3):
        model.zero_grad(set_to_none=True)
        logp, ent, log_z = response_log_probs_with_log_z(model, batch, 0.9, True, chunk_size=chunk)
        ((a * logp).sum() + (c * ent).sum() + log_z.pow(2).sum()).backward()
        results.append((logp.detach(), ent.detach(), log_z.detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp0, ent0, z0, g0), (lp1, ent1, z1, g1) = results
    torch.testing.assert_close(lp1[mask], lp0[mask], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent1[mask], ent0[mask], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(z1, z0, atol=1e-6, rtol=1e-6)
    assert z0.std() > 0
    for name, ref in g0.items():
        torch.testing.assert_close(g1[name], ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-4, msg=name)


def test_unsupported_model_is_refused(tiny_tokenizer, batch):
    model = _model(tiny_tokenizer).eval()
    assert fused_head_unsupported(model) is None
    model.config.model_type = "gemma2"  # soft-capped logits: the chunked head would be wrong
    assert "gemma2" in fused_head_unsupported(model)
    with pytest.raises(ValueError, match="use_fused_kernels=false"):
        head_log_probs(model, torch.zeros(1, 64), torch.zeros(1, dtype=torch.long), 1.0, False, 4)
    with pytest.raises(ValueError, match="chunk_size"):
        head_log_probs(model, torch.zeros(1, 64), torch.zeros(1, dtype=torch.long), 1.0, False, 0)


def test_negative_control_wrong_temperature_detected(tiny_tokenizer, batch):
    """A chunked head that ignored the temperature would fail the equality above."""
    model = _model(tiny_tokenizer).eval()
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        ref, _ = response_log_probs(model, batch, 0.7, False)
        wrong, _ = response_log_probs(model, batch, 1.0, False, chunk_size=3)
    assert (wrong[mask] - ref[mask]).abs().max() > 1e-3


def test_trainer_falls_back_where_the_head_is_not_readable(tiny_tokenizer):
    """``use_fused_kernels`` picks the configured chunk size on engines that keep the head's
    weight after forward (local, FSDP2) and the full logits, with a warning, elsewhere (FSDP1)
    or for a model whose logits are not ``lm_head(hidden)``."""
    from reference_engine import LocalEngine

    from rlforge.config import ModelConfig
    from rlforge.engine.fsdp1 import FSDP1Engine
    from rlforge.engine.fsdp2 import FSDP2Engine
    from rlforge.trainer.builders.engines import head_chunk_size

    cfg = ModelConfig()
    assert cfg.use_fused_kernels and cfg.fused_kernel_options.chunk_size >= 1
    cfg.fused_kernel_options.chunk_size = 123
    model = _model(tiny_tokenizer)
    key = "actor_rollout_ref.actor.use_fused_kernels"
    assert LocalEngine.head_readable_after_forward and FSDP2Engine.head_readable_after_forward
    assert head_chunk_size(True, cfg, model, LocalEngine, key) == 123
    assert head_chunk_size(True, cfg, model, FSDP2Engine, key) == 123
    assert head_chunk_size(False, cfg, model, LocalEngine, key) == 0
    with pytest.warns(UserWarning, match="strategy=fsdp2"):
        assert head_chunk_size(True, cfg, model, FSDP1Engine, key) == 0
    model.config.model_type = "gemma2"
    with pytest.warns(UserWarning, match="gemma2"):
        assert head_chunk_size(True, cfg, model, LocalEngine, key) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the user set no use_fused_kernels key: the fallback is silent
        assert head_chunk_size(True, cfg, model, FSDP1Engine, None) == 0


def test_log_z_is_not_a_view(tiny_tokenizer, batch):
    """log Z is returned from the FSDP2 root's forward methods; as a view of the head's [batch, 1]
    output, FSDP2 warned that an in-place op on it would drop its pre-backward hook."""
    model = PolicyWithLogZ(_model(tiny_tokenizer), 16)
    ids, am, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    for method in (model.forward_with_log_z, model.hidden_with_log_z):
        log_z = method(ids, am, pos, batch["prompts"].shape[1])[1]
        assert log_z.shape == (ids.shape[0],) and log_z._base is None, method.__name__
