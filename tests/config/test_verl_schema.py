"""Every leaf key of verl's generated PPO configs is known to rlforge (verl pinned at
:data:`rlforge.config.verl_keys.VERL_PIN`; the YAML files are copied in ``tests/config/verl_configs``).

Each key is *typed* in rlforge's schema (tests/config/test_no_silent_keys.py checks that a typed key
is read by a run or warned about), *mapped* (an alias onto rlforge's key: the resolved config changes),
or *warned* (a verl-only key: a value other than verl's default gives a warning naming it).  Each key is
set to a non-default value through the loader, one at a time.
"""

from __future__ import annotations

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


def probe(default: Any) -> Any:
    """A value a user could set, other than ``default``."""
    if isinstance(default, bool):
        return not default
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


def test_aliases_land_on_real_keys():
    for verl, ours in verl_keys.ALIASES.items():
        assert schema.lookup(RLForgeConfig, ours) is not None, (verl, ours)
        assert schema.lookup(RLForgeConfig, verl) is None, f"{verl} is typed already; drop the alias"
    for choices in verl_keys.GROUP_CHOICES.values():
        for settings in choices.values():
            assert all(schema.lookup(RLForgeConfig, k) is not None for k in settings)


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
        value = {"probe": 1} if default is None and tp is not None and schema.kind_of(tp) == "free" else probe(default)
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
