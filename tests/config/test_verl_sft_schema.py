"""Every leaf key of verl's SFT configs is known to rlforge's SFT loader (verl pinned at
:data:`rlforge.config.verl_keys.VERL_PIN`; ``sft_trainer.yaml`` and ``sft_trainer_engine.yaml`` with their
Hydra defaults resolved are copied in ``tests/config/verl_configs``).

Each key is *typed* in the SFT schema (:mod:`rlforge.config.sft`, read by the SFT trainer), *mapped* (an
alias onto an SFT key: the resolved config changes) or *warned* (a verl-only key of
:mod:`rlforge.config.verl_sft_keys`: a value other than verl's default gives a warning naming it).  Each
key is set to a non-default value through ``load_sft_config`` (loading and validation), one at a time.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest
import yaml

from config.test_verl_schema import HERE, override, probe, verl_leaves
from rlforge.config import schema
from rlforge.config.common import get_key
from rlforge.config.sft import SFT_KEY_ALIASES, SFTConfig, load_sft_config
from rlforge.config.verl_sft_keys import SFT, SFT_ALIASES
from rlforge.errors import ConfigError, RLForgeWarning

FILES = ("sft_trainer.yaml", "sft_trainer_engine.yaml")

OLD_NAMES = {old for aliases in SFT_KEY_ALIASES.values() for old in aliases}
"""Older spellings of single keys (``model.partial_pretrain``, ``optim.lr_scheduler``, ...)."""

CHOICES = {"data.truncation": "left", "trainer.resume_mode": "disable", "model.strategy": "fsdp", "engine.strategy": "fsdp",
           "optim.lr_scheduler_type": "constant", "optim.lr_scheduler": "constant", "optim.warmup_style": "constant",
           "engine.model_dtype": "bf16", "model.fsdp_config.model_dtype": "bf16", "engine.dtype": "float32",
           "trainer.logger": ["console", "file"], "trainer.device": "cpu", "optim.betas": [0.8, 0.9]}
"""Keys whose values are checked against a list: a valid value other than rlforge's default."""


def kind(key: str) -> str:
    """``typed`` | ``free`` (below a free-form field) | ``mapped`` | ``warned`` | ``unknown``."""
    if SFT.alias_of(key) is not None or key.rsplit(".", 1)[-1] in OLD_NAMES:
        return "mapped"
    if schema.lookup(SFTConfig, key) is not None:
        parts = key.split(".")
        heads = (".".join(parts[:i]) for i in range(1, len(parts)))
        return "free" if any(schema.kind_of(schema.lookup(SFTConfig, h)) == "free" for h in heads) else "typed"
    return "warned" if SFT.is_verl_only(key) else "unknown"


def load(overrides=(), config_file=None) -> tuple[SFTConfig, list[str]]:
    """The SFT config and the warnings its load printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_sft_config(list(overrides), config_file)
    return cfg, [str(w.message) for w in caught if issubclass(w.category, RLForgeWarning)]


@pytest.mark.parametrize("name", FILES)
def test_every_verl_sft_leaf_key_is_known(name):
    keys = verl_leaves(name)
    kinds = {k: kind(k) for k in keys}
    unknown = sorted(k for k, v in kinds.items() if v == "unknown")
    assert not unknown, f"verl SFT keys of {name} that rlforge does not know: {unknown}"
    counts = {v: sum(1 for x in kinds.values() if x == v) for v in ("typed", "free", "mapped", "warned")}
    assert sum(counts.values()) == len(keys) and counts["typed"] >= 25 and counts["mapped"] >= 2, counts


def test_sft_aliases_land_on_real_keys():
    for verl, ours in SFT_ALIASES.items():
        assert schema.lookup(SFTConfig, ours) is not None, (verl, ours)
        assert schema.lookup(SFTConfig, verl) is None, f"{verl} is typed already; drop the alias"
    assert not set(SFT.verl_only) & set(SFT_ALIASES)


def _probe_value(key: str, default: Any, k: str, ours: SFTConfig) -> Any:
    if key in CHOICES:
        return CHOICES[key]
    if k == "typed":
        default = get_key(ours, key)
    elif k == "mapped" and SFT.alias_of(key) is not None:
        default = get_key(ours, SFT.alias_of(key))
    return probe(default)


@pytest.mark.e2e  # a sweep of hundreds of config loads (~35-100 s on 2 cores): out of the inner loop
@pytest.mark.parametrize("name", FILES)
def test_each_verl_sft_key_set_changes_the_config_or_warns(name):
    """Set alone to a non-default value, a typed or mapped key changes the resolved SFT config, a verl-only
    key warns naming it."""
    ours, base_warnings = load()
    base = dataclasses.asdict(ours)
    silent, refused = [], []
    for key, default in verl_leaves(name).items():
        k = kind(key)
        text = override(key, _probe_value(key, default, k, ours))
        try:
            cfg, lines = load([text])
        except ConfigError as e:
            refused.append(f"{text}: {e}")
            continue
        if k == "warned":
            if not any(w.startswith(f"{key}=") for w in lines if w not in base_warnings):
                silent.append(key)
        elif dataclasses.asdict(cfg) == base:
            silent.append(key)
    assert not refused, f"the SFT loader refused these verl keys: {refused}"
    assert not silent, f"set to a non-default value, these keys changed nothing and warned about nothing: {silent}"


@pytest.mark.parametrize("name", FILES)
def test_verl_sft_file_loads_whole_with_verl_defaults_silent(name):
    """The whole file as ``--config``: accepted, and verl's own defaults of verl-only keys warn about nothing."""
    cfg, lines = load(config_file=str(HERE / name))
    assert not [w for w in lines if "; ignored" in w and "trainer.logger" not in w
                and not w.startswith("trainer.n_gpus_per_node=8")], lines
    if name == "sft_trainer.yaml":  # the older trainer: lr_scheduler (cosine) wins over the group's type
        assert cfg.optim.lr_scheduler_type == "cosine" and cfg.model.path == "~/models/gemma-1.1-7b-it"
        assert cfg.model.use_remove_padding is False  # the top-level key of the older trainer
    else:
        assert cfg.model.strategy == "fsdp" and cfg.engine.mixed_precision == {"param_dtype": "bfloat16"}
        assert cfg.optim.lr_scheduler_type == "constant" and cfg.optim.betas == [0.9, 0.999]


def test_verl_sft_examples_forms():
    """The forms of verl's SFT example scripts: group choices, the older trainer's multiturn/offload keys."""
    cfg, lines = load(["engine=fsdp", "optim=fsdp", "engine.strategy=fsdp2", "engine.fsdp_size=2",
                       "data.multiturn.enable=true", "data.multiturn.messages_key=msgs",
                       "model.fsdp_config.cpu_offload=true", "+data.response_dict_keys=[answer]"])
    assert cfg.model.strategy == "fsdp2" and cfg.engine.fsdp_size == 2 and cfg.engine.offload_policy is True
    assert cfg.data.messages_key == "msgs"
    assert any(w.startswith("data.multiturn.enable=True") for w in lines), lines
    assert any(w.startswith("data.response_dict_keys=['answer']") for w in lines), lines
    _, lines = load(["engine=megatron"])
    assert any(w.startswith("engine=megatron") for w in lines), lines
    with pytest.raises(ConfigError, match="unknown config key 'data.multiturn.made_up'"):
        load(["data.multiturn.made_up=1"])


def test_yaml_block_of_verl_only_keys_is_taken_leaf_by_leaf(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"profiler": {"enable": True, "tool_config": {"torch": {"name": "torch"}}},
                                 "model": {"fsdp_config": {"model_dtype": "bf16", "offload_params": False}}}))
    cfg, lines = load(config_file=str(f))
    assert cfg.engine.model_dtype == "bf16"
    new = [w for w in lines if "; ignored" in w]
    assert [w.split(":")[0] for w in new] == ["profiler.enable=True"], new


def test_sft_engine_checks():
    with pytest.raises(ConfigError, match="engine.model_dtype=fp16"):
        load(["engine.model_dtype=fp16"])
    with pytest.raises(ConfigError, match="engine.mixed_precision.param_dtype=float16"):
        load(["engine.dtype=float16"])
    with pytest.raises(ConfigError, match="FSDP1's CPU offload"):
        load(["model.strategy=fsdp", "engine.offload_policy=true", "trainer.device=cuda"])
    cfg, _ = load(["model.strategy=fsdp", "engine.offload_policy=true", "trainer.device=cuda",
                   "data.use_dynamic_bsz=false", "data.train_batch_size=4", "data.micro_batch_size_per_gpu=4"])
    assert cfg.engine.offload_policy is True
    _, lines = load(["engine.wrap_policy.min_num_params=1000"])
    assert any(w.startswith("engine.wrap_policy.min_num_params=1000") for w in lines), lines
    _, lines = load(["engine.param_offload=true", "trainer.device=cpu"])
    assert any("engine.param_offload=true on a CPU run" in w for w in lines), lines


def test_a_micro_batch_larger_than_the_batch_is_refused_as_verl_refuses_it():
    """verl's fsdp_sft_trainer asserts that a rank's batch is a multiple of the micro-batch: 2 samples in
    micro-batches of 4 stop there, and here with one line naming both keys (a rank's share with 4 ranks)."""
    from rlforge.config.sft import check_micro_batch

    fixed = ["data.use_dynamic_bsz=false", "data.micro_batch_size_per_gpu=4"]
    with pytest.raises(ConfigError) as e:
        load([*fixed, "data.train_batch_size=2"])
    assert str(e.value) == ("data.micro_batch_size_per_gpu=4 is larger than the batch (data.train_batch_size=2) "
                            "with data.use_dynamic_bsz=false; lower data.micro_batch_size_per_gpu or raise "
                            "data.train_batch_size")
    cfg, _ = load([*fixed, "data.train_batch_size=8"])
    check_micro_batch(cfg.data, world=2)  # 4 per rank: one micro-batch, fine
    with pytest.raises(ConfigError, match=r"\(data\.train_batch_size=8 over 4 ranks = 2 per rank\)"):
        check_micro_batch(cfg.data, world=4)
    load(["data.micro_batch_size_per_gpu=4", "data.train_batch_size=2"])  # token-budget micro-batches: unused


@pytest.mark.parametrize("value, says", [
    ("optim.lr=nan", "optim.lr=nan: must be a finite number"),  # was: a traceback from torch's AdamW
    ("optim.lr=.inf", "optim.lr=inf: must be a finite number"),  # was: a saved all-NaN model, exit 0
    ("optim.weight_decay=-1", "optim.weight_decay=-1.0: must be >= 0"),
    ("optim.lr_warmup_steps_ratio=2", "optim.lr_warmup_steps_ratio=2.0: must be in [0, 1]"),  # was: lr 0
    ("optim.clip_grad=-1", "optim.clip_grad=-1.0: must be >= 0"),  # was: accepted
    ("trainer.device=tpu", "trainer.device='tpu': expected auto, cpu, cuda or cuda:<index>"),  # was: a traceback
])
def test_optimizer_values_and_the_device_are_checked_as_in_the_rl_config(value, says):
    with pytest.raises(ConfigError) as e:
        load_sft_config(["model.path=preset:tiny", value])
    assert str(e.value).startswith(says)
