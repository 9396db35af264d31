"""Config-layer tests: schema defaults, override grammar, errors, validation, format round-trip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlforge.config import (
    LATER_WORK,
    ConfigWarning,
    RLForgeConfig,
    available_jobs,
    effective_loggers,
    format_config,
    load_config,
    validate_config,
)
from rlforge.errors import ConfigError

VERL_GSM8K_LINE = [
    "data.train_files=/tmp/gsm8k/train.parquet",
    "data.val_files=/tmp/gsm8k/test.parquet",
    "data.train_batch_size=16",
    "data.max_prompt_length=512",
    "data.max_response_length=256",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.optim.lr=1e-5",
    "critic.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.logger=['console','wandb']",
    "+trainer.val_before_train=False",
    "trainer.default_hdfs_dir=null",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.save_freq=10",
    "trainer.test_freq=10",
    "trainer.total_epochs=1",
]


def test_defaults_match_verl() -> None:
    cfg = load_config()
    assert isinstance(cfg, RLForgeConfig)
    actor = cfg.actor_rollout_ref.actor
    assert (actor.ppo_mini_batch_size, actor.clip_ratio_c, actor.kl_loss_type) == (256, 3.0, "low_var_kl")
    assert actor.optim.lr == 1e-6 and actor.optim.lr_scheduler_type == "constant" and actor.optim.num_cycles == 0.5
    assert actor.policy_loss.loss_mode == "vanilla" and actor.loss_agg_mode == "token-mean"
    assert actor.checkpoint.load_contents == ["model", "optimizer", "extra"]
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.tensor_model_parallel_size, rollout.max_num_seqs, rollout.gpu_memory_utilization) == (2, 1024, 0.5)
    assert rollout.prompt_length == 512 and rollout.val_kwargs.temperature == 0.0
    assert cfg.critic.optim.lr == 1e-5 and cfg.critic.cliprange_value == 0.5
    assert cfg.critic.ppo_mini_batch_size == 256 and cfg.critic.rollout_n == 1
    assert cfg.critic.forward_max_token_len_per_gpu == 32768
    assert cfg.data.train_batch_size == 1024 and cfg.data.truncation == "error" and cfg.data.val_batch_size is None
    assert cfg.algorithm.adv_estimator == "gae" and cfg.algorithm.kl_ctrl.horizon == 10000
    assert cfg.reward_model.reward_manager == "naive" and cfg.custom_reward_function.name == "compute_score"
    assert cfg.trainer.total_epochs == 30 and cfg.trainer.resume_mode == "auto"
    assert cfg.trainer.default_local_dir == "checkpoints/rlforge/default"
    # rlforge deviations
    assert cfg.trainer.logger == ["console"] and cfg.trainer.device == "auto"
    assert cfg.actor_rollout_ref.model.path == "smollm2-135m-instruct" and cfg.critic.model.path is None


def test_plain_override_and_interpolations_follow() -> None:
    cfg = load_config(["data.max_prompt_length=64", "actor_rollout_ref.rollout.n=4", "trainer.experiment_name=x"])
    assert cfg.actor_rollout_ref.rollout.prompt_length == 64
    assert cfg.critic.rollout_n == 4
    assert cfg.trainer.default_local_dir == "checkpoints/rlforge/x"


def test_yaml_values_parse() -> None:
    cfg = load_config(["actor_rollout_ref.actor.optim.lr=1e-5", "data.val_batch_size=null",
                       "data.shuffle=false", "trainer.logger=[console,file]", "actor_rollout_ref.actor.optim.betas=[0.9,0.95]"])
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-5)
    assert cfg.data.val_batch_size is None and cfg.data.shuffle is False
    assert cfg.trainer.logger == ["console", "file"]
    assert cfg.actor_rollout_ref.actor.optim.betas == [0.9, 0.95]


def test_plus_into_free_form_dict_is_kept() -> None:
    cfg = load_config(["+actor_rollout_ref.model.override_config.attention_dropout=0.1"])
    assert cfg.actor_rollout_ref.model.override_config == {"attention_dropout": 0.1}


def test_plus_on_existing_key_sets_it() -> None:
    assert load_config(["+trainer.val_before_train=False"]).trainer.val_before_train is False


def test_plus_unknown_key_warns_and_is_ignored() -> None:
    with pytest.warns(ConfigWarning, match=r"\+trainer\.some_verl_only\.knob"):
        cfg = load_config(["+trainer.some_verl_only.knob=3"])
    assert not hasattr(cfg.trainer, "some_verl_only")


def test_warmup_style_alias() -> None:
    cfg = load_config(["actor_rollout_ref.actor.optim.warmup_style=cosine"])
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"


def test_unknown_key_names_key_and_suggestion() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(["actor_rollout_ref.actor.clip_ratoi=0.3"])
    assert str(err.value) == ("unknown config key 'actor_rollout_ref.actor.clip_ratoi'; "
                              "did you mean 'actor_rollout_ref.actor.clip_ratio'?")


def test_unknown_key_in_yaml_names_file(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  train_batch_sise: 8\n")
    with pytest.raises(ConfigError, match=r"'data\.train_batch_sise' in config file .*run\.yaml.*did you mean 'data\.train_batch_size'"):
        load_config(config_file=str(path))


def test_wrong_type_names_key_value_type() -> None:
    with pytest.raises(ConfigError, match=r"^data\.train_batch_size: expected int, got 'abc'"):
        load_config(["data.train_batch_size=abc"])


def test_missing_config_file_and_malformed_override(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(config_file=str(missing))
    with pytest.raises(ConfigError, match="'data.train_batch_size'"):
        load_config(["data.train_batch_size"])


def test_layering_job_then_file_then_override(tmp_path: Path) -> None:
    assert "default" in available_jobs()
    job = load_config(job="default")
    assert job.algorithm.adv_estimator == "grpo" and job.actor_rollout_ref.rollout.n == 4
    assert job.trainer.experiment_name == "default_job" and job.data.train_files == "builtin:arithmetic"
    path = tmp_path / "c.yaml"
    path.write_text("actor_rollout_ref:\n  rollout:\n    n: 8\ntrainer:\n  test_freq: 5\n")
    cfg = load_config(["actor_rollout_ref.rollout.n=2"], config_file=str(path), job="default")
    assert cfg.actor_rollout_ref.rollout.n == 2  # override beats file
    assert cfg.trainer.test_freq == 5  # file beats job
    assert cfg.data.train_batch_size == 8  # job beats defaults
    assert validate_config(job) == []


def test_unknown_job() -> None:
    with pytest.raises(ConfigError, match="unknown job 'nope'.*default"):
        load_config(job="nope")


def test_verl_command_line_loads_with_warnings() -> None:
    cfg = load_config(VERL_GSM8K_LINE)
    warnings = validate_config(cfg)
    assert cfg.critic.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert any(w.startswith("actor_rollout_ref.rollout.name=vllm is not available in this build; running rlforge's "
                            "native engine instead") for w in warnings)
    assert not any("gpu_memory_utilization" in w for w in warnings)  # the native engine uses it
    assert not any("'wandb'" in w for w in warnings)  # wandb is a supported logger now
    assert effective_loggers(cfg) == ["console", "wandb"]
    assert not any(w.startswith("actor_rollout_ref.rollout.tensor_model_parallel_size") for w in warnings)


def test_other_verl_loggers_are_skipped_with_a_warning() -> None:
    cfg = load_config(["trainer.logger=[console,swanlab,tensorboard]"])
    assert any("'swanlab'" in w and "skipped" in w for w in validate_config(cfg))
    assert effective_loggers(cfg) == ["console", "tensorboard"]


def test_later_work_rows_fire_only_when_set() -> None:
    base = load_config(job="default")
    assert validate_config(base) == []
    cfg = load_config(["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                       "actor_rollout_ref.actor.fsdp_config.param_offload=true", "trainer.n_gpus_per_node=8",
                       "trainer.device=cuda"],  # a GPU run: on a CPU run param_offload warns (nothing to offload to)
                      job="default")
    warnings = validate_config(cfg)
    assert any(w.startswith("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2") for w in warnings)
    # FSDP settings and several devices take effect now: no warning
    assert not any("fsdp_config" in w or "n_gpus_per_node" in w for w in warnings)
    assert len({row.key for row in LATER_WORK}) == len(LATER_WORK)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=8"],
         "data.train_batch_size=12 is not divisible by actor_rollout_ref.actor.ppo_mini_batch_size=8"),
        (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
         "actor_rollout_ref.actor.ppo_mini_batch_size * actor_rollout_ref.rollout.n = 8 * 4 = 32"),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=16"], "is larger than data.train_batch_size=8"),
        (["actor_rollout_ref.rollout.n=0"], "actor_rollout_ref.rollout.n=0: must be >= 1"),
        (["data.truncation=both"], "data.truncation='both' is not one of error, left, right, middle"),
        (["trainer.resume_mode=latest"], "trainer.resume_mode='latest'"),
        (["actor_rollout_ref.actor.optim.lr_scheduler_type=linear"], "lr_scheduler_type='linear'"),
        (["actor_rollout_ref.actor.loss_agg_mode=sum"], "loss_agg_mode='sum'"),
        (["algorithm.adv_estimator=gae", "critic.model.path=m", "critic.ppo_micro_batch_size_per_gpu=5"],
         "critic.ppo_mini_batch_size * actor_rollout_ref.rollout.n"),
        (["trainer.profile_steps=[2,0]"], "trainer.profile_steps=[2, 0]: must be null or a list of steps >= 1"),
        (["trainer.gpu_sample_interval_s=-1"], "trainer.gpu_sample_interval_s=-1.0: must be >= 0"),
    ],
)
def test_validation_errors_name_keys(overrides: list[str], needle: str) -> None:
    cfg = load_config(overrides, job="default")
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    assert needle in str(err.value)


def test_gae_without_critic_path_uses_the_actor_path() -> None:
    # verl's critic.model.path defaults to the actor's model; rlforge's None means the same.
    cfg = load_config(["algorithm.adv_estimator=gae"], job="default")
    assert validate_config(cfg) == []
    from rlforge.trainer.builders.critic import critic_model_path

    assert critic_model_path(cfg) == "smollm2-135m-instruct"


def test_micro_batch_counts_sequences() -> None:
    # mini 8 prompts x n 4 = 32 sequences; micro 16 divides 32 though not 8.
    cfg = load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"], job="default")
    assert validate_config(cfg) == []


def test_grpo_with_single_response_warns() -> None:
    warnings = validate_config(load_config(["actor_rollout_ref.rollout.n=1"], job="default"))
    assert any("rollout.n=1" in w and "grpo" in w for w in warnings)


@pytest.mark.parametrize("job", [None, "default"])
def test_format_round_trip(tmp_path: Path, job: str | None) -> None:
    cfg = load_config(["+actor_rollout_ref.model.override_config.rope_theta=10000", "trainer.logger=[console,file]"], job=job)
    text = format_config(cfg)
    assert "${" not in text and "experiment_name:" in text
    path = tmp_path / "printed.yaml"
    path.write_text(text)
    again = load_config(config_file=str(path))
    assert again == cfg
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg)


@pytest.mark.parametrize("override,fragment", [
    ("actor_rollout_ref.rollout.max_num_seqs=0", "max_num_seqs=0: must be >= 1"),
    ("actor_rollout_ref.rollout.max_num_batched_tokens=-5", "max_num_batched_tokens=-5: must be >= 1"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=1.5", "gpu_memory_utilization=1.5: must be in (0, 1]"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=0", "gpu_memory_utilization=0.0: must be in (0, 1]"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=0", "tensor_model_parallel_size=0: must be >= 1"),
    ("actor_rollout_ref.rollout.cudagraph_capture_sizes=[0,8]", "cudagraph_capture_sizes=[0, 8]: must be null"),
    ("actor_rollout_ref.rollout.cudagraph_capture_sizes=abc", "cudagraph_capture_sizes=abc: must be null"),
    ("actor_rollout_ref.rollout.max_model_len=64", "max_model_len=64 is smaller than"),
    # token budgets are range-checked even with dynamic batching off (they are inherited by other keys)
    ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=-5", "log_prob_max_token_len_per_gpu=-5: must be >= 1"),
    ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=0", "log_prob_max_token_len_per_gpu=0: must be >= 1"),
    ("critic.ppo_max_token_len_per_gpu=0", "critic.ppo_max_token_len_per_gpu=0: must be >= 1"),
    ("critic.forward_max_token_len_per_gpu=-1", "critic.forward_max_token_len_per_gpu=-1: must be >= 1"),
])
def test_rollout_engine_sizes_are_checked(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate_config(load_config(["data.max_prompt_length=64", "data.max_response_length=64", override]))
    assert fragment in str(e.value)


def test_default_job_without_a_step_count_names_save_freq() -> None:
    """The default job's ``trainer.save_freq`` is ``${trainer.total_training_steps}``: an epoch-based run
    must set it, and the error says so."""
    with pytest.raises(ConfigError, match=r"'trainer.save_freq'.*set trainer.save_freq to a value"):
        load_config(["trainer.total_training_steps=null"], job="default")
    assert load_config(["trainer.total_training_steps=null", "trainer.save_freq=-1"], job="default").trainer.save_freq == -1


def test_dynamic_bsz_ignores_micro_batch_sizes_with_a_warning() -> None:
    """verl's own GRPO scripts set the micro batch sizes beside use_dynamic_bsz=True, where the token
    budget replaces them: no divisibility error then (a micro of 3 does not divide 8 x 4 = 32), one
    warning line naming every unused key with its value, and none (and the error) with it off."""
    A = "actor_rollout_ref"
    keys = [f"{A}.actor.ppo_micro_batch_size_per_gpu=3", f"{A}.rollout.log_prob_micro_batch_size_per_gpu=5",
            f"{A}.ref.log_prob_micro_batch_size_per_gpu=7"]
    warnings = validate_config(load_config([*keys, f"{A}.actor.use_dynamic_bsz=true"], job="default"))
    hits = [w for w in warnings if "no effect with use_dynamic_bsz" in w]
    assert len(hits) == 1 and all(k in hits[0] for k in keys), warnings
    off = validate_config(load_config(keys[1:], job="default"))
    assert not any("no effect with use_dynamic_bsz" in w for w in off)  # used without a token budget
    with pytest.raises(ConfigError, match="is not divisible by"):
        validate_config(load_config([keys[0]], job="default"))
    from rlforge.trainer.builders.sizes import token_budgets

    cfg = load_config([*keys, f"{A}.actor.use_dynamic_bsz=true"], job="default")
    budgets = token_budgets(cfg)  # what the engines split by when set (engine.base.micro_batches)
    assert budgets["actor"] == cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    assert budgets["log_prob"] == cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu
    assert budgets["ref"] == cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu
