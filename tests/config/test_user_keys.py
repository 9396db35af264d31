"""Warnings only about keys the user set (the ``--config`` file, overrides), not about values of the
embedded job or values that follow another key (rlforge.config.user_keys, config/later_work.py),
and the verl defaults that rlforge replaces (``rollout.name=vllm``)."""

from __future__ import annotations

from rlforge.config import load_config, validate_config
from rlforge.config.user_keys import leaf_keys, user_keys, user_set
from rlforge.trainer.builders.engines import fused_kernels_key

A, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"


def test_the_loader_records_the_keys_of_the_file_and_the_overrides(tmp_path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  train_batch_size: 16\nactor_rollout_ref:\n  actor:\n    optim:\n"
                    "      warmup_style: cosine\n")  # an alias, recorded under its current name
    cfg = load_config([f"{A}.use_dynamic_bsz=true", "+trainer.val_before_train=false"], config_file=str(path),
                      job="default")
    assert user_keys(cfg) == {"data.train_batch_size", f"{A}.optim.lr_scheduler_type", f"{A}.use_dynamic_bsz",
                              "trainer.val_before_train"}  # not the job's ppo_micro_batch_size_per_gpu=8
    assert user_set(cfg, f"{A}.optim") and user_set(cfg, f"{A}.optim.lr_scheduler_type.x")
    assert not user_set(cfg, f"{A}.ppo_micro_batch_size_per_gpu") and not user_set(cfg, f"{A}.optim.lr")
    assert user_set(object(), "any.key")  # a config built in code: every key is the user's
    assert leaf_keys({"a": {"b": 1, "c": [2], "d": {}}}) == {"a.b", "a.c", "a.d"}


def test_no_micro_batch_warning_for_the_jobs_sizes() -> None:
    """The default job sets ppo_micro_batch_size_per_gpu=8 and the log-prob sizes; the user only turns
    dynamic batching on: nothing of theirs is ignored."""
    warnings = validate_config(load_config([f"{A}.use_dynamic_bsz=true"], job="default"))
    assert not [w for w in warnings if "micro_batch_size" in w], warnings
    warnings = validate_config(load_config([f"{A}.use_dynamic_bsz=true", f"{A}.ppo_micro_batch_size_per_gpu=4"],
                                           job="default"))
    assert [w for w in warnings if "micro_batch_size" in w] == [
        f"{A}.ppo_micro_batch_size_per_gpu=4: no effect with use_dynamic_bsz / log_prob_use_dynamic_bsz on, which "
        "pack micro-batches to the *_max_token_len_per_gpu token budgets instead (as verl does); ignored"]


def test_no_warning_for_reference_megatron_sizes_that_follow_the_actors() -> None:
    warnings = validate_config(load_config([f"{A}.megatron.tensor_model_parallel_size=2"], job="default"))
    assert [w for w in warnings if "megatron" in w] == [
        f"{A}.megatron.tensor_model_parallel_size=2 only applies with {A}.strategy=megatron; ignored"]
    warnings = validate_config(load_config([f"{REF}.megatron.tensor_model_parallel_size=2"], job="default"))
    assert [w for w in warnings if "megatron" in w] == [
        f"{REF}.megatron.tensor_model_parallel_size=2 only applies with {A}.strategy=megatron; ignored"]


def test_verl_defaults_that_rlforge_replaces_are_still_reported() -> None:
    """verl's default rollout (vLLM, tensor-parallel 2) is replaced by rlforge's: a choice of rlforge's
    that changes what the run does, reported although the user set neither key."""
    warnings = validate_config(load_config(job=None))
    assert any(w.startswith("actor_rollout_ref.rollout.name=vllm is not available") for w in warnings)
    assert any(w.startswith("actor_rollout_ref.rollout.tensor_model_parallel_size=2:") for w in warnings)
    assert validate_config(load_config(job="default")) == []


def test_fused_kernels_warning_names_the_key_the_user_set() -> None:
    """None (no warning on a fallback to the full logits) unless the user set the key; the policy and
    the reference then name the same key, so the one warning is printed once."""
    model = "actor_rollout_ref.model.use_fused_kernels"
    cfg = load_config([f"{A}.strategy=megatron"], job="default")
    assert fused_kernels_key(cfg, f"{A}.use_fused_kernels") is None and fused_kernels_key(cfg, model) is None
    cfg = load_config([f"{model}=true"], job="default")
    assert fused_kernels_key(cfg, f"{A}.use_fused_kernels") == model == fused_kernels_key(cfg, model)
    cfg = load_config([f"{A}.use_fused_kernels=true"], job="default")
    assert fused_kernels_key(cfg, f"{A}.use_fused_kernels") == f"{A}.use_fused_kernels"
    assert fused_kernels_key(cfg, model) is None
