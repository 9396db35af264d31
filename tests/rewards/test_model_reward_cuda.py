"""On a CUDA GPU: the reward model scores in bf16 close to the float32 CPU scores and its weights are back in
host memory after scoring; the judge generates on the native engine and its weights leave the GPU too."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from rlforge.rewards.reward_model import SequenceRewardModel

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class _Tok:
    pad_token_id = 0


def test_reward_model_bf16_on_the_gpu_sleeps_in_host_memory() -> None:
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, pad_token_id=0, num_labels=1)).eval()
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(1, 512, (int(n),), generator=g).tolist() for n in torch.randint(5, 40, (9,), generator=g)]
    cpu = SequenceRewardModel(copy.deepcopy(model), _Tok(), torch.device("cpu"), micro_batch_size=4).score_ids(ids)
    rm = SequenceRewardModel(model, _Tok(), torch.device("cuda"), torch.bfloat16, micro_batch_size=4)
    assert all(p.device.type == "cpu" for p in rm.model.parameters())
    gpu = rm.score_ids(ids)
    assert all(p.device.type == "cpu" for p in rm.model.parameters())
    assert gpu.dtype == torch.float32 and gpu.device.type == "cpu"
    torch.testing.assert_close(gpu, cpu, atol=0.05 * float(cpu.abs().max()) + 1e-3, rtol=0.05)


def test_judge_generates_on_the_gpu_and_leaves_it(tiny_tokenizer) -> None:
    from rlforge.models import load_causal_lm
    from rlforge.rewards.judge import engine_generate
    from rlforge.rollout.base import SamplingParams

    module = load_causal_lm("preset:tiny", tiny_tokenizer, seed=0).eval().to(torch.bfloat16)
    gen = engine_generate(module, tiny_tokenizer, torch.device("cuda"), torch.bfloat16,
                          SamplingParams(do_sample=False, max_new_tokens=4))
    ids = [tiny_tokenizer("Grade: 1+1=2", add_special_tokens=False)["input_ids"]] * 3
    first, second = gen(ids), gen(ids)
    assert len(first) == 3 and first == second  # greedy, and a second call after the weights came back
    assert all(p.device.type == "cpu" for p in module.parameters())
