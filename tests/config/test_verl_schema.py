"""Every leaf key of verl's generated PPO configs is known to rlforge (verl pinned at
:data:`rlforge.config.verl_keys.VERL_PIN`; the YAML files are copied in ``tests/config/verl_configs``).

Each key is *typed* in rlforge's schema (tests/config/test_no_silent_keys.py checks that a typed key
is read by a run or warned about), *mapped* (an alias onto rlforge's key: the resolved config changes),
or *warned* (a verl-only key: a value other than verl's default gives a warning naming it).  Each key is
set to a non-default value through the loader, one at a time.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlforge.config import load_config, schema, verl_keys
from rlforge.config.common import get_key
from rlforge.config.later_work import later_work_warnings
from rlforge.config.loader import _canonical_key
from rlforge.config.root import RLForgeConfig

HERE = Path(__file__).parent / "verl_configs"
FILES = ("_generated_ppo_trainer.yaml", "_generated_ppo_megatron_trainer.yaml")


def verl_leaves(name: str) -> dict[str, Any]:
    """``dotted key -> verl's default`` of every leaf of the file (``_target_`` and ``defaults`` skipped)."""
    out: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if k == "_target_" or (not prefix and k == "defaults"):
                continue
            if isinstance(v, dict) and v:
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v

    walk(yaml.safe_load((HERE / name).read_text()), "")
    return out


def kind(key: str) -> str:
    """``typed`` | ``free`` (below a free-form field of the schema) | ``mapped`` | ``warned`` | ``unknown``."""
    if verl_keys.alias_of(key) is not None or _canonical_key(key) != key:
        return "mapped"
    if schema.lookup(RLForgeConfig, key) is not None:
        parts = key.split(".")
        heads = (".".join(parts[:i]) for i in range(1, len(parts)))
        return "free" if any(schema.kind_of(schema.lookup(RLForgeConfig, h)) == "free" for h in heads) else "typed"
    return "warned" if verl_keys.is_verl_only(key) else "unknown"


def probe(default: Any, tp: Any = None) -> Any:
    """A value a user could set, other than ``default`` (of rlforge's type ``tp`` where given: ``list[int]``
    gets a number)."""
    if tp is not None and typing.get_origin(schema.strip_optional(tp)) is list:
        numbers = typing.get_args(schema.strip_optional(tp)) in ((int,), (float,))
        return [*(default if isinstance(default, list) else []), 2 if numbers else "probe"]
    if isinstance(default, bool):
        return not default
    if default is None and tp is not None and schema.strip_optional(tp) is bool:  # 2 is no bool (the loader refuses it)
        return True
    if isinstance(default, int):
        return default + 2
    if isinstance(default, float):
        return default + 0.25
    if isinstance(default, list):
        return [*default, default[-1]] if default else ["probe"]
    if isinstance(default, dict):
        return {"probe": 1}
    if default is None or (isinstance(default, str) and "${" in default):
        return 2
    return f"{default}-probe"


def override(key: str, value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    return f"{key}={text}"


@pytest.mark.parametrize("name", FILES)
def test_every_verl_leaf_key_is_known(name):
    keys = verl_leaves(name)
    kinds = {k: kind(k) for k in keys}
    unknown = sorted(k for k, v in kinds.items() if v == "unknown")
    assert not unknown, f"verl keys of {name} that rlforge does not know: {unknown}"
    counts = {v: sum(1 for x in kinds.values() if x == v) for v in ("typed", "free", "mapped", "warned")}
    assert sum(counts.values()) == len(keys) > 400, counts
    free = sorted(k for k, v in kinds.items() if v == "free")
    stray = [k for k in free if not k.startswith(VERL_FREE_FORM)]
    assert not stray, f"verl types these keys, rlforge takes them free-form: {stray}"
    assert "global_profiler.global_tool_config.nsys.worker_nsight_options.kill" in free


VERL_FREE_FORM = (
    "actor_rollout_ref.model.override_config.", "critic.model.override_config.",  # HFModelConfig: dict
    "actor_rollout_ref.actor.megatron.override_transformer_config.",  # McoreEngineConfig: dict
    "critic.megatron.override_transformer_config.",
    "global_profiler.global_tool_config.nsys.controller_nsight_options.",  # nsys command-line options
    "global_profiler.global_tool_config.nsys.worker_nsight_options.",
    "ray_kwargs.ray_init.",  # ray.init keyword arguments
)
"""The only verl leaves that lie below a free-form field of rlforge's schema: those below verl's own dicts
(written out by hand from verl's dataclasses and YAML)."""


def test_typed_blocks_refuse_a_typo_and_a_wrong_type():
    from rlforge.errors import ConfigError

    cases = {
        "actor_rollout_ref.rollout.multi_turn.max_turns=2": "unknown config key 'actor_rollout_ref.rollout.multi_turn"
                                                            ".max_turns'; did you mean",
        "critic.profiler.tool_config.torch.content=[cpu]": "did you mean 'critic.profiler.tool_config.torch.contents'",
        "actor_rollout_ref.rollout.agent.num_worker=4": "did you mean 'actor_rollout_ref.rollout.agent.num_workers'",
        "actor_rollout_ref.rollout.engine_kwargs.vlm.swap_space=4": "did you mean "
                                                                   "'actor_rollout_ref.rollout.engine_kwargs.vllm'",
        "reward_model.sandbox_fusion.urls=x": "did you mean 'reward_model.sandbox_fusion.url'",
        "data.sampler.class=x": "unknown config key 'data.sampler.class'",
        "actor_rollout_ref.rollout.trace.token2text=maybe": "actor_rollout_ref.rollout.trace.token2text: expected bool",
        "actor_rollout_ref.ref.profiler.ranks=[a]": "actor_rollout_ref.ref.profiler.ranks: expected list of int",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError) as e:
            load_config([override])
        assert message in str(e.value) and "\n" not in str(e.value), (override, str(e.value))


def test_free_form_dicts_of_verl_take_new_keys():
    cfg = load_config(["+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
                       "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton",
                       "+ray_kwargs.ray_init.runtime_env.env_vars.A=1"])
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm == {"swap_space": 4}
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.sglang == {"attention_backend": "triton"}
    assert cfg.ray_kwargs.ray_init == {"runtime_env": {"env_vars": {"A": 1}}}


def test_role_profilers_follow_the_global_block_as_in_verl():
    cfg = load_config(["global_profiler.tool=torch", "global_profiler.save_path=p",
                       "actor_rollout_ref.actor.profiler.ranks=[0,1]",
                       "global_profiler.global_tool_config.torch_memory.stack_depth=8"])
    arr = cfg.actor_rollout_ref
    assert (arr.actor.profiler.tool, arr.ref.profiler.save_path, cfg.critic.profiler.tool) == ("torch", "p", "torch")
    assert arr.rollout.profiler.ranks == [0, 1] and cfg.reward_model.profiler.ranks == []
    assert arr.rollout.profiler.tool_config.torch_memory.stack_depth == 8
    new = [w for w in later_work_warnings(cfg) if "profiler" in w and "global_profiler" not in w.partition("=")[0]]
    assert [w.partition(":")[0] for w in new] == ["actor_rollout_ref.actor.profiler.ranks=[0, 1]"], new


def test_aliases_land_on_real_keys():
    for verl, ours in verl_keys.ALIASES.items():
        assert schema.lookup(RLForgeConfig, ours) is not None, (verl, ours)
        typed = schema.lookup(RLForgeConfig, verl)  # below a free-form dict (reward_kwargs) lookup gives Any
        assert typed is None or typed is Any, f"{verl} is typed already; drop the alias"
    for choices in verl_keys.GROUP_CHOICES.values():
        for settings in choices.values():
            assert all(schema.lookup(RLForgeConfig, k) is not None for k in settings)


def _first_leaf(key: str, tp: Any) -> str:
    """The first leaf key below the schema block ``key`` of type ``tp``."""
    cls = schema.strip_optional(tp)
    return next(f"{key}.{k}" for k in schema.all_keys(cls) if schema.kind_of(schema.lookup(cls, k)) != "node")


@pytest.mark.e2e  # a sweep of hundreds of config loads (~35-100 s on 2 cores): out of the inner loop
@pytest.mark.parametrize("name", FILES)
def test_each_verl_key_set_changes_the_config_or_warns(name):
    """Set alone to a non-default value, a mapped key changes rlforge's key, a verl-only key warns naming it,
    a typed key changes the resolved config (the schema walk checks it is read or warned)."""
    base_warnings = set(later_work_warnings(load_config()))
    silent, refused = [], []
    ours = load_config()
    for key, default in verl_leaves(name).items():
        k = kind(key)
        if k == "typed":  # rlforge's own (resolved) default gives the value's type
            default = get_key(ours, key)
        elif k == "mapped":
            default = get_key(ours, verl_keys.alias_of(key) or _canonical_key(key))
        tp = schema.lookup(RLForgeConfig, verl_keys.alias_of(key) or _canonical_key(key))
        if k == "typed" and schema.kind_of(tp) == "node":  # verl gives a block as ${...} (the rollout's profiler
            key = _first_leaf(key, tp)                   # tool_config follows the actor's): set a leaf of it
            default = get_key(ours, key)
            tp = schema.lookup(RLForgeConfig, key)
        value = {"probe": 1} if default is None and tp is not None and schema.kind_of(tp) == "free" else probe(default, tp)
        try:
            cfg = load_config([override(key, value)])
        except Exception as e:  # noqa: BLE001 - collected and reported below
            refused.append(f"{override(key, value)}: {e}")
            continue
        if k == "warned":
            new = [w for w in later_work_warnings(cfg) if w not in base_warnings]
            if not any(w.startswith(f"{key}=") for w in new):
                silent.append(key)
        elif k == "mapped":
            target = verl_keys.alias_of(key) or _canonical_key(key)
            if get_key(cfg, target) == get_key(load_config(), target):
                silent.append(key)
        elif k == "typed" and get_key(cfg, key) == get_key(load_config(), key):
            silent.append(key)
    assert not refused, f"the loader refused these verl keys: {refused}"
    assert not silent, f"set to a non-default value, these keys changed nothing and warned about nothing: {silent}"


def test_verl_only_default_is_silent_and_a_yaml_block_is_taken_leaf_by_leaf(tmp_path):
    base = set(later_work_warnings(load_config()))
    cfg = load_config(["actor_rollout_ref.rollout.expert_parallel_size=1", "trainer.use_v1=false"])
    assert set(later_work_warnings(cfg)) == base
    f = tmp_path / "c.yaml"
    f.write_text("actor_rollout_ref:\n  model:\n    lora:\n      rank: 8\n      type: lora\n      dropout: 0.1\n"
                 "  actor:\n    router_replay:\n      mode: R2\n")
    cfg = load_config(config_file=str(f))
    assert cfg.actor_rollout_ref.model.lora_rank == 8
    lines = [w for w in later_work_warnings(cfg) if w not in base]
    assert any(w.startswith("actor_rollout_ref.model.lora.dropout=0.1") for w in lines), lines
    assert any(w.startswith("actor_rollout_ref.actor.router_replay.mode=R2") and "router replay" in w
               for w in lines), lines
    assert not any("lora.type" in w for w in lines)  # verl's default


def test_model_engine_megatron_is_the_megatron_strategy():
    cfg = load_config(["model_engine=megatron"])
    assert cfg.actor_rollout_ref.actor.strategy == "megatron" and cfg.critic.strategy == "megatron"
    other = load_config(["model_engine=veomni"])
    assert other.actor_rollout_ref.actor.strategy == "fsdp"
    assert any(w.startswith("model_engine=veomni") for w in later_work_warnings(other))


def test_unknown_key_inside_a_verl_block_is_still_an_error():
    from rlforge.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown config key"):
        load_config(["actor_rollout_ref.rollout.prometheus.made_up=1"])


@pytest.mark.parametrize("value, shown", [("2", "2"), ("3", "3"), ("1", "1"), ("yes", "'yes'"), ("on", "'on'")])
def test_a_bool_key_refuses_a_value_that_is_no_boolean(value, shown, tmp_path):
    """OmegaConf reads any non-zero number and yes/on as true; verl's keys are bools: one line names key and value."""
    from rlforge.errors import ConfigError

    override = f"actor_rollout_ref.rollout.multi_turn.enable={value}"
    with pytest.raises(ConfigError) as e:
        load_config([override])
    assert str(e.value) == (f"actor_rollout_ref.rollout.multi_turn.enable: expected bool (true or false), got {shown} "
                            f"(from override '{override}')")
    with pytest.raises(ConfigError, match=r"^algorithm\.filter_groups\.enable: expected bool .*got 2 \(from config "):
        load_config(config_file=_yaml_file(tmp_path, "algorithm:\n  filter_groups:\n    enable: 2\n"))


def test_a_bool_key_takes_true_and_false_and_yamls_own_booleans(tmp_path):
    assert load_config(["actor_rollout_ref.rollout.multi_turn.enable=True"]).actor_rollout_ref.rollout.multi_turn.enable
    on = load_config(config_file=_yaml_file(tmp_path, "algorithm:\n  filter_groups:\n    enable: yes\n"))
    assert on.algorithm.filter_groups.enable is True
    # Hydra's grammar reads `yes` as a string: so does rlforge's command line, where a key is free-form
    cfg = load_config(["+actor_rollout_ref.rollout.engine_kwargs.vllm.x=yes"])
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm == {"x": "yes"}


def _yaml_file(folder: Path, text: str) -> str:
    path = folder / "c.yaml"
    path.write_text(text)
    return str(path)
