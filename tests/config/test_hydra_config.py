"""verl's configuration forms (issue 38, item 3): Hydra's ``--config-path DIR --config-name NAME`` with a
YAML file's ``defaults:`` list resolved against rlforge's built-in groups (verl's ``ppo_trainer`` and
``ppo_megatron_trainer``), and the overrides ``+key=``, ``++key=``, ``~key``, ``~key=value``.

The fixtures under ``hydra_fixtures/`` are written in the shape of verl's own files (a defaults list
with ``group@package: option`` entries, ``${model_engine}`` interpolation, ``_target_`` metadata, a
recipe's ``hydra.searchpath``).  The references are written out by hand: the megatron config is the
default one with the three trained roles' ``strategy`` set to ``megatron`` (verl's
``ppo_megatron_trainer.yaml`` = ``ppo_trainer`` + ``override model_engine: megatron``, whose
``megatron_actor/ref/critic`` groups set ``strategy: megatron``)."""

from __future__ import annotations

import importlib
import subprocess
import warnings
from pathlib import Path

import pytest
from helpers import user_error
from omegaconf import OmegaConf

from rlforge.config import ConfigWarning, load_config
from rlforge.config.user_keys import user_keys
from rlforge.errors import ConfigError

FIXTURES = Path(__file__).parent / "hydra_fixtures"
MEGATRON = ["actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.ref.strategy=megatron",
            "critic.strategy=megatron"]


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """The current directory is an empty folder (no ``config/`` in it), as in verl's checkout root."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def in_process(capfd, *args: str, module: str = "rlforge.cli") -> subprocess.CompletedProcess:
    """``module``'s ``main(args)`` in this process, with its status and what it printed."""
    capfd.readouterr()
    status = importlib.import_module(module).main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(list(args), status, out, err)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- verl's built-in configs -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["ppo_megatron_trainer.yaml", "ppo_megatron_trainer", "_generated_ppo_megatron_trainer"])
def test_verl_megatron_config_name_is_the_defaults_with_megatron_roles(in_tmp, name) -> None:
    cfg = load_config(config_path="config", config_name=name)
    assert cfg == load_config(MEGATRON)
    assert (cfg.actor_rollout_ref.actor.strategy, cfg.actor_rollout_ref.ref.strategy, cfg.critic.strategy) == (
        "megatron", "megatron", "megatron")
    assert user_keys(cfg) == frozenset()  # verl's base config, not keys the user wrote


def test_verl_ppo_trainer_config_name_is_the_schema_defaults(in_tmp) -> None:
    assert load_config(config_path="config", config_name="ppo_trainer") == load_config()
    assert load_config(config_path="config") == load_config()  # Hydra's config name stays ppo_trainer


def test_verl_own_config_folder_is_not_read(in_tmp) -> None:
    """``--config-path`` naming a checkout's ``verl/trainer/config``: its files hold verl's whole schema
    (keys rlforge does not have), so the built-in config stands for them."""
    folder = in_tmp / "verl" / "trainer" / "config"
    _write(folder, "actor/dp_actor.yaml", "strategy: fsdp\nsome_verl_only_key: 1\n")
    _write(folder, "ppo_trainer.yaml", "defaults:\n  - model_engine: dp\n  - _self_\nverl_only_root_key: 1\n")
    _write(folder, "ppo_megatron_trainer.yaml", "defaults:\n  - ppo_trainer\n  - override model_engine: megatron\n")
    assert load_config(config_path=str(folder), config_name="ppo_megatron_trainer") == load_config(MEGATRON)


# --- a user's file with a defaults list ------------------------------------------------------------

def test_verl_style_primary_config(monkeypatch) -> None:
    monkeypatch.chdir(FIXTURES.parent)
    cfg = load_config(["data.train_batch_size=64"], config_path="hydra_fixtures", config_name="small_ppo_trainer")
    actor = cfg.actor_rollout_ref.actor
    assert actor.strategy == "fsdp" and cfg.critic.strategy == "fsdp"  # model_engine: dp
    assert (actor.ppo_mini_batch_size, actor.optim.lr) == (16, 2.0e-6)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.kl_ctrl.kl_coef == 0.002
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length) == (64, 256)  # the command line last
    assert {"actor_rollout_ref.actor.optim.lr", "data.train_batch_size"} <= user_keys(cfg)


def test_model_engine_override_reaches_the_interpolated_groups(tmp_path) -> None:
    """``override model_engine: megatron`` after the groups that read ``${model_engine}``: they follow it."""
    text = (FIXTURES / "small_ppo_trainer.yaml").read_text().replace(
        "  - _self_", "  - override model_engine: megatron\n  - _self_")
    path = _write(tmp_path, "mine.yaml", text)
    cfg = load_config(config_path=str(tmp_path), config_name=path.name)
    assert (cfg.actor_rollout_ref.actor.strategy, cfg.actor_rollout_ref.ref.strategy, cfg.critic.strategy) == (
        "megatron", "megatron", "megatron")


def test_recipe_on_verl_megatron_base(monkeypatch) -> None:
    monkeypatch.chdir(FIXTURES)
    cfg = load_config(["trainer.total_epochs=4"], config_path=".", config_name="megatron_recipe.yaml")
    assert load_config(config_file="megatron_recipe.yaml", overrides=["trainer.total_epochs=4"]) == cfg
    assert cfg == load_config([*MEGATRON, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                               "actor_rollout_ref.rollout.n=4", "trainer.total_epochs=4"])
    assert cfg.actor_rollout_ref.ref.megatron.tensor_model_parallel_size == 2  # the ref follows the actor


def test_self_position_local_group_and_package_header(monkeypatch) -> None:
    """``_self_`` first: the group (``# @package _global_``) and the config listed after it win."""
    monkeypatch.chdir(FIXTURES)
    cfg = load_config(config_name="with_own_group")
    assert (cfg.trainer.total_epochs, cfg.trainer.total_training_steps) == (1, 2)
    assert cfg.trainer.experiment_name == "own_group" and cfg.data.train_batch_size == 32


def test_self_is_last_when_not_listed(tmp_path) -> None:
    _write(tmp_path, "g/a.yaml", "total_epochs: 7\n")
    path = _write(tmp_path, "c.yaml", "defaults:\n  - g@trainer: a\ntrainer:\n  total_epochs: 2\n")
    assert load_config(config_file=str(path)).trainer.total_epochs == 2
    path.write_text("defaults:\n  - _self_\n  - g@trainer: a\ntrainer:\n  total_epochs: 2\n")
    assert load_config(config_file=str(path)).trainer.total_epochs == 7


def test_engine_rlforge_does_not_have_warns_once_with_file_and_line(tmp_path) -> None:
    path = _write(tmp_path, "v.yaml", "defaults:\n  - ppo_trainer\n  - override model_engine: veomni\n  - _self_\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cfg = load_config(config_file=str(path))
    messages = [str(w.message) for w in seen if issubclass(w.category, ConfigWarning)]
    assert len(messages) == 1 and f"config file '{path}', line 3" in messages[0] and "VeOmni" in messages[0]
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp"


# --- bad input: one line with the file, the line and the cause ----------------------------------------

@pytest.mark.parametrize("text, fragments", [
    ("defaults:\n  - ppo_trainer\n  - nosuch_group: x\n",
     ["line 3", "defaults entry 'nosuch_group: x'", "no config group 'nosuch_group'"]),
    ("defaults:\n  - ppo_trainer\n  - actor@actor_rollout_ref.actor: fancy_actor\n",
     ["line 3", "group 'actor' has no option 'fancy_actor'", "megatron_actor"]),
    ("defaults:\n  - no_such_base\n", ["line 2", "no config 'no_such_base'", "ppo_megatron_trainer"]),
    ("defaults:\n  - override model_engine: megatron\n",
     ["line 2", "no 'model_engine' in the defaults list to override"]),
    ("defaults:\n  - ppo_trainer\n  - actor@actor_rollout_ref.actor: ${no_group}_actor\n",
     ["line 3", "'${no_group}' names no group"]),
    ("defaults: [ppo_trainer\ndata: {}\n", ["line 2, column 5", "not valid YAML"]),
    ("defaults: ppo_trainer\n", ["line 1", "'defaults' must be a list"]),
])
def test_bad_defaults_are_one_line_with_file_and_line(tmp_path, text, fragments) -> None:
    path = _write(tmp_path, "bad.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config(config_path=str(tmp_path), config_name="bad")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"config file '{path}'"), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_missing_config_name_file(in_tmp) -> None:
    with pytest.raises(ConfigError, match=r"^--config-name my_run.yaml: no file config/my_run.yaml .*current "
                       r"directory.*ppo_trainer, ppo_megatron_trainer, fully_async_ppo_trainer, .*one_step_off_ppo_megatron_trainer$"):
        load_config(config_path="config", config_name="my_run.yaml")


# --- the command line -------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [
    ["--config-path=config", "--config-name=ppo_megatron_trainer.yaml"],
    ["--config-path", "config", "--config-name", "ppo_megatron_trainer"],
    ["-cp", "config", "-cn", "ppo_megatron_trainer"],
])
def test_main_ppo_takes_hydra_flags(in_tmp, capfd, flags) -> None:
    res = in_process(capfd, *flags, "--print-config", "trainer.total_epochs=2", module="rlforge.trainer.main_ppo")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines.count("    strategy: megatron") == 2 and "  strategy: megatron" in lines  # actor, ref; critic
    assert "  total_epochs: 2" in lines


def test_rlforge_train_with_a_config_name_starts_from_it_not_the_job(in_tmp, capfd) -> None:
    _write(in_tmp, "conf/run.yaml", "defaults:\n  - ppo_trainer\n  - _self_\ntrainer:\n  total_epochs: 6\n")
    res = in_process(capfd, "train", "--config-path", "conf", "--config-name", "run", "--print-config")
    assert res.returncode == 0, res.stderr
    assert "  total_epochs: 6" in res.stdout.splitlines()
    assert "adv_estimator: gae" in res.stdout  # verl's defaults, not the embedded job's grpo


def test_cli_bad_defaults_entry_is_one_error_line(tmp_path, capfd) -> None:
    path = _write(tmp_path, "bad.yaml", "defaults:\n  - ppo_trainer\n  - nosuch_group: x\n")
    user_error(in_process(capfd, "train", f"--config-path={tmp_path}", "--config-name=bad", "--print-config"),
               f"config file '{path}', line 3", "no config group 'nosuch_group'")
    user_error(in_process(capfd, "train", "--config-path", str(tmp_path), "--config-name", "none_here"),
               "--config-name none_here: no file")


def test_cli_takes_delete_overrides_after_flags(capfd) -> None:
    res = in_process(capfd, "train", "trainer.total_epochs=9", "--print-config", "~trainer.total_epochs")
    assert res.returncode == 0, res.stderr
    assert "  total_epochs: 30" in res.stdout.splitlines()  # verl's default; the job does not set it


# --- +key, ++key, ~key --------------------------------------------------------------------------------

def test_plus_plus_sets_an_existing_key_or_adds_below_a_free_form_field() -> None:
    cfg = load_config(["++trainer.total_epochs=2", "++actor_rollout_ref.model.override_config.rope_theta=5"])
    assert cfg.trainer.total_epochs == 2
    assert cfg.actor_rollout_ref.model.override_config == {"rope_theta": 5}


def test_plus_plus_unknown_key_warns_and_is_ignored() -> None:
    with pytest.warns(ConfigWarning, match=r"ignoring '\+\+trainer\.verl_only_knob'"):  # quoted as written
        cfg = load_config(["++trainer.verl_only_knob=3"])
    assert not hasattr(cfg.trainer, "verl_only_knob")


def test_delete_resets_a_key_to_its_schema_default_after_the_job() -> None:
    job = load_config(job="default")
    assert job.actor_rollout_ref.actor.optim.lr == 1.0e-5  # the job's value
    cfg = load_config(["actor_rollout_ref.actor.optim.lr=3e-6", "~actor_rollout_ref.actor.optim.lr"], job="default")
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6  # verl's default
    assert "actor_rollout_ref.actor.optim.lr" not in user_keys(cfg)


def test_delete_order_and_blocks() -> None:
    assert load_config(["~trainer.total_epochs", "trainer.total_epochs=4"]).trainer.total_epochs == 4
    cfg = load_config(["critic.optim.lr=0.5", "critic.optim.weight_decay=0.5", "~critic.optim"])
    assert (cfg.critic.optim.lr, cfg.critic.optim.weight_decay) == (1e-5, 0.01)
    # an interpolated default follows its source again: the reference's strategy is the actor's
    cfg = load_config(["actor_rollout_ref.ref.strategy=fsdp2", "actor_rollout_ref.actor.strategy=megatron",
                       "~actor_rollout_ref.ref.strategy"])
    assert cfg.actor_rollout_ref.ref.strategy == "megatron"
    # an older verl name is the current key
    cfg = load_config(["actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", "~actor_rollout_ref.actor.optim.warmup_style"])
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "constant"


def test_delete_of_a_verl_alias_deletes_the_key_it_maps_onto() -> None:
    a = "actor_rollout_ref.actor"
    cfg = load_config([f"{a}.optim.clip_grad=3.0", f"~{a}.optim.clip_grad"])
    assert cfg.actor_rollout_ref.actor.grad_clip == 1.0  # verl's default
    assert f"{a}.grad_clip" not in user_keys(cfg)
    # the rlforge key given directly is deleted through the alias too; a later value wins again
    assert load_config([f"{a}.grad_clip=2.5", f"~{a}.optim.clip_grad"]).actor_rollout_ref.actor.grad_clip == 1.0
    assert load_config([f"~{a}.optim.clip_grad", f"{a}.optim.clip_grad=4.0"]).actor_rollout_ref.actor.grad_clip == 4.0
    # ~key=value compares with the value on rlforge's key
    assert load_config([f"{a}.optim.clip_grad=3.0", f"~{a}.optim.clip_grad=3.0"]).actor_rollout_ref.actor.grad_clip == 1.0
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.grad_clip is 3\.0, not 2\.0"):
        load_config([f"{a}.optim.clip_grad=3.0", f"~{a}.optim.clip_grad=2.0"])
    # a block of verl's aliases: every rlforge key below it
    m = "actor_rollout_ref.model"
    cfg = load_config([f"{m}.lora.rank=8", f"{m}.lora.alpha=64", f"~{m}.lora"])
    assert (cfg.actor_rollout_ref.model.lora_rank, cfg.actor_rollout_ref.model.lora_alpha) == (0, 16)


def test_delete_of_a_verl_only_key_drops_its_warning() -> None:
    from rlforge.config.later_work import later_work_warnings

    key = "actor_rollout_ref.rollout.expert_parallel_size"
    assert any(w.startswith(f"{key}=4") for w in later_work_warnings(load_config([f"{key}=4"])))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not an rlforge config key" warning: the key is verl's
        cfg = load_config([f"{key}=4", f"~{key}"])
    assert not any(key in w for w in later_work_warnings(cfg))


def test_delete_below_a_free_form_field_removes_the_entry() -> None:
    cfg = load_config(["+actor_rollout_ref.model.override_config.a=1", "+actor_rollout_ref.model.override_config.b=2",
                       "~actor_rollout_ref.model.override_config.a"])
    assert cfg.actor_rollout_ref.model.override_config == {"b": 2}


def test_delete_with_a_value_deletes_only_that_value() -> None:
    assert load_config(["trainer.total_epochs=3", "~trainer.total_epochs=3"]).trainer.total_epochs == 30
    with pytest.raises(ConfigError, match=r"^override '~trainer.total_epochs=4': trainer.total_epochs is 3, not 4"):
        load_config(["trainer.total_epochs=3", "~trainer.total_epochs=4"])


@pytest.mark.parametrize("override, fragment", [
    ("~trainer.verl_only_knob", "not an rlforge config key"),
    ("~actor_rollout_ref.model.override_config.absent", "is not set"),
])
def test_delete_of_what_is_not_there_warns(override, fragment) -> None:
    with pytest.warns(ConfigWarning, match=fragment):
        assert load_config([override]) == load_config()


def test_malformed_delete() -> None:
    with pytest.raises(ConfigError, match=r"not of the form ~key"):
        load_config(["~"])


@pytest.mark.parametrize(("value", "expected"), [
    ("{enable_thinking:false}", {"enable_thinking": False}),
    ("{enable_thinking: false}", {"enable_thinking": False}),
    ("{a:1,b:{c:x}}", {"a": 1, "b": {"c": "x"}}),
    ("{a:'x:y', b:\"1,c:2\"}", {"a": "x:y", "b": "1,c:2"}),  # quoted values kept as written
])
def test_hydra_dict_values_without_spaces_read_as_hydra_reads_them(value, expected):
    """Hydra's grammar reads ``{a:1}`` as ``{'a': 1}``; YAML alone would read the key ``'a:1'`` with a null value,
    so a verl command line's ``data.apply_chat_template_kwargs={enable_thinking:false}`` would be lost."""
    cfg = load_config([f"data.apply_chat_template_kwargs={value}"])
    got = cfg.data.apply_chat_template_kwargs
    assert (OmegaConf.to_container(got) if OmegaConf.is_config(got) else got) == expected
