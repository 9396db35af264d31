"""Activation checkpointing and activation offload (CPU fallback) leave gradients and
state_dict keys unchanged; decoder layers are found through known wrappers."""

from __future__ import annotations

import copy

import pytest
import torch

from rlforge.engine.activation import LayerWrapper, apply_activation_wrappers, clean_name, decoder_layers
from rlforge.models.log_z import PolicyWithLogZ


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    from rlforge.models import load_causal_lm

    return load_causal_lm("preset:tiny", tiny_tokenizer, {"initializer_range": 0.2}, seed=1)


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 1000, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    module.train()
    module.zero_grad(set_to_none=True)
    out = module(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                 use_cache=False)
    logp = torch.log_softmax(out.logits.float(), -1)
    (-(logp.gather(-1, ids[:, :, None]).mean()) + logp.exp().pow(2).mean()).backward()
    return {clean_name(n): p.grad.clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize(("ckpt", "offload"), [(True, False), (False, True), (True, True)])
def test_wrappers_keep_gradients(model, ckpt, offload):
    ref = _grads(model)
    wrapped = copy.deepcopy(model)
    state = apply_activation_wrappers(wrapped, ckpt, offload)
    assert all(isinstance(layer, LayerWrapper) for layer in decoder_layers(wrapped))
    assert list(wrapped.state_dict()) == list(model.state_dict())
    got = _grads(wrapped)
    assert set(got) == set(ref)
    for k in ref:
        assert torch.allclose(got[k], ref[k], atol=1e-6, rtol=1e-5), k
    if offload and not ckpt:  # the CPU fallback really went through pack/unpack
        assert state is not None and any(items for _, items in state.records)


def test_decoder_layers_lookup(model):
    assert len(decoder_layers(model)) == model.config.num_hidden_layers
    assert decoder_layers(PolicyWithLogZ(model, 8)) == decoder_layers(model)
    with pytest.raises(ValueError, match="decoder layers of Linear"):
        decoder_layers(torch.nn.Linear(2, 2))
