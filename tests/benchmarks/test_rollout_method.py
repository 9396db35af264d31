"""benchmarks/rollout_throughput.py's method on CPU: the floors (embedding-table bytes, the
continuous-batching schedule, spec bandwidths), token counting, and the transformers
``generate`` setups giving each row the length the long-tail workload asks for."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlforge.models.presets import PRESETS

_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


roof = _load("rollout_roofline")
hf = _load("hf_baselines")


def _tiny(tied: bool):
    cls, kw = PRESETS["tiny"]
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cls(**{**kw, "tie_word_embeddings": tied, "vocab_size": 512})).eval()


@pytest.mark.parametrize("tied", [False, True])
def test_embedding_table_not_charged_unless_tied(tied: bool) -> None:
    model = _tiny(tied)
    emb = model.get_input_embeddings().weight
    every = {id(p): p for p in model.parameters()}.values()
    all_bytes = sum(p.numel() * p.element_size() for p in every)
    cost = roof.ModelCost.of(model)
    want = all_bytes if tied else all_bytes - emb.numel() * emb.element_size()
    assert cost.weight_bytes == want
    assert cost.embed_row_bytes == emb.shape[1] * emb.element_size()
    matrices = sum(p.numel() for p in every if p.dim() == 2)
    assert cost.matmul_params == (matrices if tied else matrices - emb.numel())
    c = model.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert cost.kv_bytes_per_token == c.num_hidden_layers * 2 * c.num_key_value_heads * hd * 2


def test_schedule_by_hand() -> None:
    """3 sequences (prompts of 2) making 3, 1, 2 tokens, 2 slots: seq 2 takes seq 1's slot."""
    steps = list(roof.decode_schedule(np.array([2, 2, 2]), np.array([3, 1, 2]), 2))
    assert steps == [(2, 4), (2, 5), (2, 7)]


def test_schedule_fixed_lengths_is_waves() -> None:
    """Equal lengths: ceil(n / slots) waves of N steps, each step reading b * (P + t) tokens."""
    p, n_new, n, slots = 5, 4, 7, 3
    steps = list(roof.decode_schedule(np.full(n, p), np.full(n, n_new), slots))
    want = [(b, b * (p + t)) for b in (3, 3, 1) for t in range(n_new)]
    assert steps == want


def test_run_floor_by_hand() -> None:
    cost = roof.ModelCost(weight_bytes=1000, embed_row_bytes=10, kv_bytes_per_token=2, matmul_params=100,
                          attn_flops_per_ctx_token=8)
    f = roof.run_floor(cost, np.array([2, 2, 2]), np.array([3, 1, 2]), 2, bandwidth=100.0, peak=1e30)
    assert f.decode_steps == 3
    assert f.decode_s == pytest.approx(sum((1000 + 2 * 10 + ctx * 2) / 100.0 for ctx in (4, 5, 7)))
    # compute-bound: FLOPs over peak, and prefill at the peak (2 x params x tokens + causal attention)
    g = roof.run_floor(cost, np.array([2]), np.array([1]), 1, bandwidth=1e30, peak=1.0)
    assert g.decode_s == pytest.approx(2 * 100 + 8 * 2)
    assert g.prefill_s == pytest.approx(2 * 100 * 2 + 8 * (1 + 2))
    assert g.total_s == pytest.approx(g.decode_s + g.prefill_s)


def test_spec_bandwidth_by_name() -> None:
    assert roof.spec_bandwidth("NVIDIA H200") == 4.8e12
    assert roof.spec_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert math.isnan(roof.spec_bandwidth("Some GPU"))


def test_count_generated() -> None:
    new = torch.tensor([[5, 6, 1, 0], [5, 5, 5, 5], [1, 0, 0, 0]])
    assert hf.count_generated(new, [1]) == 3 + 4 + 1
    assert hf.count_generated(new, []) == 12


@pytest.fixture(scope="module")
def tiny():
    return _tiny(False)


def _ids(n: int, p: int, vocab: int) -> torch.Tensor:
    return torch.randint(100, vocab - 100, (n, p), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("setup", ["generate", "generate-old", "generate-mask", "generate-noeos"])
def test_generate_setups_fixed_lengths(tiny, setup: str) -> None:
    ids = _ids(3, 5, tiny.config.vocab_size)
    tokens, sec, note = hf.run_setup(tiny, setup, ids, np.full(3, 6))
    assert tokens == 18 and sec > 0 and note == ""


@pytest.mark.parametrize("setup", ["generate", "generate-mask"])
def test_generate_long_tail_lengths(tiny, setup: str) -> None:
    """Each row ends with EOS exactly at its length (a forced EOS, none before), and only those tokens count."""
    lengths = np.array([3, 9, 1, 5])
    ids = _ids(4, 5, tiny.config.vocab_size)
    tokens, _, _ = hf.run_setup(tiny, setup, ids, lengths)
    assert tokens == lengths.sum()
    proc = hf.ForcedLengths(5, lengths, hf.FORCED_EOS, ids.device)
    out = tiny.generate(ids, max_new_tokens=9, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0,
                        eos_token_id=hf.FORCED_EOS, logits_processor=[proc])
    new = out[:, 5:]
    for i, n in enumerate(lengths):
        hits = (new[i] == hf.FORCED_EOS).nonzero().flatten().tolist()
        assert hits and hits[0] == n - 1, (i, n, new[i].tolist())


@pytest.mark.parametrize(("max_time", "warm_steps"), [(None, 8), (30.0, None)])
def test_long_tail_warm_up(tiny, monkeypatch, max_time, warm_steps) -> None:
    """On the long tail the warm-up is the call stopped after 8 steps, or, with ``max_time``, the same
    time-limited call (so the timed call runs warm over the steps it reaches)."""
    calls: list[dict] = []
    real = tiny.generate

    def spy(ids, **kw):
        calls.append(kw)
        return real(ids, **kw)

    monkeypatch.setattr(tiny, "generate", spy)
    hf.run_setup(tiny, "generate", _ids(2, 5, tiny.config.vocab_size), np.array([3, 12]), max_time=max_time)
    warm, timed = calls
    assert warm.get("max_time") == timed.get("max_time") == max_time
    stop = warm.get("stopping_criteria")
    assert (stop[0].steps if stop else None) == warm_steps and "stopping_criteria" not in timed


def test_eos_off_setup_refuses_long_tail(tiny) -> None:
    with pytest.raises(ValueError, match="EOS off"):
        hf.run_setup(tiny, "generate-old", _ids(2, 5, tiny.config.vocab_size), np.array([2, 4]))


def test_native_engine_gets_per_row_lengths(tiny) -> None:
    """The long-tail workload's native rows: each row generates exactly its own length, counted from the engine's sequences."""
    rt = _load("rollout_throughput")
    lengths = np.array([3, 1, 6, 2])
    batch = rt.prompts(4, tiny.config.vocab_size, seed=0)
    made: list = []
    eng = rt.NativeRollout(tiny, [], 0, torch.device("cpu"), progress=False, ignore_eos=True, seed=0)
    with rt.per_row_lengths(lengths, made):
        eng.generate(batch, rt.SamplingParams(temperature=1.0, max_new_tokens=int(lengths.max())))
    assert [len(s.output_ids) for s in sorted(made, key=lambda s: s.seq_id)] == lengths.tolist()
    import rlforge.rollout.native.engine as engine_module
    from rlforge.rollout.native.sequence import Sequence

    assert engine_module.Sequence is Sequence  # restored
