"""LoRA (``model.lora_rank``) on the FSDP2 engine of one process (a one-rank group, as ``rlforge
train`` runs on one device), with gradient checkpointing, dynamic batching and the padding-free
forward.  The references are independent of rlforge's LoRA code: the untouched base model's own
forward, and transformers + peft (``PeftModel.from_pretrained`` on the exported folder, its
``generate``)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import dist_common as dc  # noqa: E402

from rlforge.engine.base import copy_full_params  # noqa: E402
from rlforge.errors import ConfigError  # noqa: E402
from rlforge.models.lora import (  # noqa: E402
    adapted_names,
    apply_lora,
    is_adapter_key,
    merged_params,
    write_adapter_folder,
)

CPU = torch.device("cpu")
BUDGET = 40  # tokens per micro-batch: dynamic batching makes several micro-batches of the 6 rows


def lora_cfg(rank: int = 4, **kw) -> SimpleNamespace:
    return SimpleNamespace(lora_rank=rank, lora_alpha=8, target_modules="all-linear", exclude_modules=None,
                           lora_adapter_path=None, **kw)


def _engine(module, optim: bool = True):
    from rlforge.config.common import FSDPConfig
    from rlforge.engine import ENGINES

    eng = ENGINES.get("fsdp2")(module, CPU, fsdp_config=FSDPConfig(), optim_cfg=dc.actor_cfg().optim if optim else None,
                               total_steps=10, grad_clip=1.0, gradient_checkpointing=True,
                               trainable_state_only=True)
    return eng


def _actor(engine):
    from rlforge.roles.actor import Actor

    return Actor(engine, dc.actor_cfg(), mini_batch_size=dc.ROWS, micro_batch_size=2, log_prob_micro_batch_size=2,
                 max_token_len=BUDGET, log_prob_max_token_len=BUDGET, remove_padding=True)


def _base_log_probs(model, batch):
    from rlforge.roles.forward import response_log_probs

    with torch.no_grad():
        return response_log_probs(model.eval(), batch, dc.TEMPERATURE, with_entropy=False)[0]


@pytest.fixture(autouse=True)
def _one_rank_group():
    """The one-rank group a job makes (``init_single_process``); tests/conftest.py destroys it after each test."""
    from rlforge.engine.distributed import init_single_process

    init_single_process(CPU)
    yield


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two LoRA steps on FSDP2 (one rank); the untouched base model; the batch; the engine."""
    from rlforge.engine.adapter_off import AdapterOffEngine
    from rlforge.engine.distributed import init_single_process
    from rlforge.roles.actor import LogProbModel

    init_single_process(CPU)
    base, tok = dc.load_model()
    batch = dc.make_batch(base, tok)
    model = copy.deepcopy(base)
    plan = apply_lora(model, lora_cfg(), "actor_rollout_ref.model", "preset:tiny")
    engine = _engine(model)
    actor = _actor(engine)
    n_opt = sum(p.numel() for g in engine.optimizer.param_groups for p in g["params"])
    first = [actor.update(batch, dc.TEMPERATURE).metrics]
    mid_state = copy.deepcopy(engine.state_dict())  # on one CPU rank the full tensors may alias the parameters
    first.append(actor.update(batch, dc.TEMPERATURE).metrics)
    ref = LogProbModel(AdapterOffEngine(engine), 2, BUDGET, remove_padding=True)
    out = {
        "base": base, "tok": tok, "batch": batch, "plan": plan, "engine": engine, "actor": actor, "n_opt": n_opt,
        "metrics": first, "mid_state": mid_state, "final_state": engine.state_dict(),
        "full": dict(engine.full_params_iter("cpu")),
        "ref_logp": ref.compute_log_prob(batch, dc.TEMPERATURE)["log_probs"],
        "actor_logp": actor.compute_log_prob(batch, dc.TEMPERATURE)["log_probs"],
    }
    yield out
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def test_only_adapter_trains_base_bit_identical(trained):
    base = trained["base"].state_dict()
    full = trained["full"]
    adapter = {k: v for k, v in full.items() if is_adapter_key(k)}
    assert adapter and trained["n_opt"] == sum(v.numel() for v in adapter.values())  # only the adapter is optimized
    for k, v in full.items():
        if not is_adapter_key(k):
            assert torch.equal(v, base[k.replace(".base_layer.", ".")]), k  # frozen base: bit-identical
    assert all(float(v.abs().max()) > 0 for k, v in adapter.items() if ".lora_B." in k)  # B starts at 0: it moved
    assert trained["metrics"][0]["grad_norm"] > 0
    assert set(trained["final_state"]["model"]) == set(adapter)  # checkpoints hold the adapter only
    assert len(trained["final_state"]["optimizer"]["state"]) == len(adapter)


def test_reference_is_the_base_model(trained):
    mask = trained["batch"]["response_mask"].bool()
    want = _base_log_probs(trained["base"], trained["batch"])[mask]  # positions after EOS are masked everywhere
    got = trained["ref_logp"][mask]
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    want = _base_log_probs(trained["base"], trained["batch"])
    assert (trained["actor_logp"] - want)[mask].abs().max() > 1e-4  # the adapter is on in the actor's forward


def test_resume_is_bit_exact(trained):
    """A fresh model (other adapter init) loaded from the step-1 state trains step 2 exactly as the run."""
    model = copy.deepcopy(trained["base"])
    torch.manual_seed(123)  # a different lora_A init: only the checkpoint can make them equal
    apply_lora(model, lora_cfg(), "actor_rollout_ref.model", "preset:tiny")
    engine = _engine(model)
    engine.load_state_dict(trained["mid_state"])
    _actor(engine).update(trained["batch"], dc.TEMPERATURE)
    again = engine.state_dict()
    for k, v in trained["final_state"]["model"].items():
        assert torch.equal(again["model"][k], v), k
    for i, s in trained["final_state"]["optimizer"]["state"].items():
        for name, t in s.items():
            assert torch.equal(torch.as_tensor(again["optimizer"]["state"][i][name]), torch.as_tensor(t)), (i, name)
    with pytest.raises(ValueError, match="not this adapter"):
        engine.load_state_dict({"model": trained["base"].state_dict(), "optimizer": None})


def test_exported_adapter_loads_with_peft_and_rollout_matches(trained, tmp_path):
    """The adapter folder loads with peft and gives the trained actor's log-probs; the rollout's
    plain copy with the merged weights generates peft's greedy tokens."""
    from peft import PeftModel

    from rlforge.rollout import SamplingParams
    from rlforge.rollout.native import NativeRollout

    plan, full, batch, tok = trained["plan"], trained["full"], trained["batch"], trained["tok"]
    # Make the adapter large enough to change greedy tokens (two small steps barely move it).
    g = torch.Generator().manual_seed(7)
    full = {k: (torch.randn(v.shape, generator=g) * 0.3 if ".lora_B." in k else v) for k, v in full.items()}
    write_adapter_folder(tmp_path / "adapter", plan, full)
    peft_model = PeftModel.from_pretrained(copy.deepcopy(trained["base"]), str(tmp_path / "adapter")).eval()
    model = copy.deepcopy(trained["base"])
    apply_lora(model, lora_cfg(), "actor_rollout_ref.model", "preset:tiny")
    model.load_state_dict(full)
    assert torch.allclose(_base_log_probs(peft_model, batch), _base_log_probs(model, batch), atol=1e-5)

    rollout_copy = copy.deepcopy(trained["base"])
    keep = adapted_names(plan)
    copy_full_params(merged_params(((k, v) for k, v in full.items() if keep(k)), plan), rollout_copy)
    prompts = _prompts(batch)
    eos = [dc.EOS]
    engine = NativeRollout(rollout_copy.eval(), eos, tok.pad_token_id, CPU)
    got = engine.generate(prompts, SamplingParams(do_sample=False, max_new_tokens=8))["responses"]
    with torch.no_grad():
        ref = peft_model.generate(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"],
                                  max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    want = ref[:, prompts["input_ids"].shape[1]:]
    base_out = NativeRollout(copy.deepcopy(trained["base"]).eval(), eos, tok.pad_token_id, CPU).generate(
        prompts, SamplingParams(do_sample=False, max_new_tokens=8))["responses"]
    assert not torch.equal(base_out, got)  # the merged adapter changes the greedy tokens
    n = min(want.shape[1], got.shape[1])
    assert torch.equal(got[:, :n], want[:, :n]), (got, want)


def _prompts(batch):
    from rlforge.batch import Batch

    ids = batch["prompts"]
    mask = batch["attention_mask"][:, : ids.shape[1]]
    return Batch.from_dict({"input_ids": ids, "attention_mask": mask,
                            "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})


def test_bad_targets_and_keys(tiny_model):
    import rlforge.config
    from rlforge.config import validate_config
    from rlforge.config.lora import lora_strategy

    with pytest.raises(ConfigError, match=r"target_modules: \['qq_proj'\] match no module.*q_proj"):
        apply_lora(copy.deepcopy(tiny_model), SimpleNamespace(**{**vars(lora_cfg()), "target_modules": ["qq_proj"]}),
                   "actor_rollout_ref.model", "preset:tiny")
    with pytest.raises(ConfigError, match="LM head"):
        apply_lora(copy.deepcopy(tiny_model), SimpleNamespace(**{**vars(lora_cfg()), "target_modules": ["lm_head"]}),
                   "actor_rollout_ref.model", "preset:tiny")
    for override, text in (("actor_rollout_ref.model.lora_rank=-1", "actor_rollout_ref.model.lora_rank=-1"),
                           ("actor_rollout_ref.model.lora_alpha=32", "lora_rank=0"),
                           ("critic.model.lora_alpha=32", "critic.model.lora_alpha=32")):
        with pytest.raises(ConfigError, match=text):
            validate_config(rlforge.config.load_config([override]))
    for strategy in ("fsdp", "megatron"):  # verl's megatron LoRA scripts run, on the FSDP2 engine
        cfg = rlforge.config.load_config(["actor_rollout_ref.model.lora_rank=8",
                                          f"actor_rollout_ref.actor.strategy={strategy}"])
        warnings = validate_config(cfg)
        assert any(f"strategy={strategy} with" in w and "running actor_rollout_ref.actor.strategy=fsdp2" in w
                   for w in warnings), warnings
        assert lora_strategy(strategy, cfg.actor_rollout_ref.model) == "fsdp2"


def test_adapter_path_overrides_explicit_keys_with_a_warning(trained, tmp_path):
    """With ``lora_adapter_path`` the folder's adapter_config.json decides rank, alpha and targets: explicit
    keys are named as ignored (and the adapter's own rank is what trains); a missing folder is one error."""
    import rlforge.config
    from rlforge.config import validate_config

    folder = tmp_path / "a"
    write_adapter_folder(folder, trained["plan"], trained["full"])
    node = "actor_rollout_ref.model"
    warned = validate_config(rlforge.config.load_config([
        f"{node}.lora_adapter_path={folder}", f"{node}.lora_rank=8", f"{node}.lora_alpha=32",
        f"{node}.target_modules=[k_proj]"]))
    hits = [w for w in warned if "lora_adapter_path" in w]
    assert len(hits) == 1 and all(k in hits[0] for k in (f"{node}.lora_rank=8", f"{node}.lora_alpha=32",
                                                         "target_modules=['k_proj']", "ignored")), warned
    warned = validate_config(rlforge.config.load_config([f"{node}.lora_adapter_path={folder}"]))
    assert any("lora_rank=0: LoRA is on" in w for w in warned), warned
    plain = validate_config(rlforge.config.load_config([f"{node}.lora_rank=8"]))
    assert not [w for w in plain if "lora_adapter_path" in w]
    cfg = SimpleNamespace(**{**vars(lora_cfg()), "lora_rank": 8, "lora_adapter_path": str(folder)})
    plan = apply_lora(copy.deepcopy(trained["base"]), cfg, node, "preset:tiny")
    assert plan.config.r == trained["plan"].config.r == 4  # the folder's rank, not the explicit 8
    missing = SimpleNamespace(**{**vars(lora_cfg()), "lora_adapter_path": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="missing: no such folder"):
        apply_lora(copy.deepcopy(trained["base"]), missing, node, "preset:tiny")


def test_adapter_of_another_base_is_one_error(trained, tmp_path, tiny_tokenizer):
    """An adapter folder written for preset:tiny does not fit a model of another width."""
    from rlforge.models import load_causal_lm

    write_adapter_folder(tmp_path / "a", trained["plan"], trained["full"])
    other = load_causal_lm("preset:tiny", tiny_tokenizer, {"hidden_size": 32, "intermediate_size": 64}, seed=0)
    cfg = SimpleNamespace(**{**vars(lora_cfg()), "lora_adapter_path": str(tmp_path / "a")})
    with pytest.raises(ConfigError, match=r"trained on base model preset:tiny, which does not fit other-model"):
        apply_lora(other, cfg, "actor_rollout_ref.model", "other-model")


def test_critic_adapter_trains_the_value_head(tiny_tokenizer):
    """``critic.model.lora_rank``: the value model's linear layers get the adapter; its ``score``
    head is not adapted and trains whole; everything else is frozen."""
    from rlforge.models import load_value_model

    critic = load_value_model("preset:tiny", tiny_tokenizer, {}, seed=0)
    apply_lora(critic, lora_cfg(), "critic.model", "preset:tiny", trainable=("score",))
    trainable = {n for n, p in critic.named_parameters() if p.requires_grad}
    assert {n for n in trainable if not is_adapter_key(n)} == {n for n, _ in critic.score.named_parameters(prefix="score")}
    assert any(is_adapter_key(n) for n in trainable) and not any(n.startswith("score.") and "lora" in n for n in trainable)
