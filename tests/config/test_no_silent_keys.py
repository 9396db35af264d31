"""No config key is ignored silently.

Every leaf key of the schema, in every section (``data``, ``actor_rollout_ref``, ``critic``,
``reward_model``, ``custom_reward_function``, ``algorithm``, ``trainer``, ``global_profiler``, ``ray_kwargs``,
...; walked from the dataclasses) must either be *consumed*: read by the code while a job is built
and trained (:func:`rlforge.cli.run_train`, one step, on ``preset:tiny`` on the CPU), or *warned*:
set to a value other than its default, it makes :func:`~rlforge.config.later_work.later_work_warnings`
print a line naming it (a row of ``LATER_WORK``), or validation refuses it with an error naming it
(a combination that cannot work, such as FSDP offload under ``strategy=megatron``).

"Read" is recorded by turning every dataclass instance of the loaded config into an instance of
a recording subclass (:class:`ReadRecorder`).  Reads that only look at the config do not count:
validation, the later-work warnings, printing and dumping the config (:data:`NOT_CONSUMING`), and
anything done inside OmegaConf or ``dataclasses``.  Reading is a proxy for "changes what the job
does"; for the keys that matter most the effect itself is checked (offload, regional compile) or
the warning's text (Liger).

Keys that only some modes read get a run in that mode (:data:`RUNS`: native vs hf rollout, FSDP2
vs FSDP1 vs ``strategy=megatron``, a critic, a reference, FlowRL, checkpoints, validation), the
policy losses are called once each with a recording config, and what no CPU run can read is in
the small table :data:`READ_ELSEWHERE`, each entry checked against the source.  For the rollout
backends and the training engines the check is also per mode (:data:`BACKENDS`): a key that one
backend reads and another does not must warn under the other.  The reward model's and the judge's
keys are walked the same way by ``tests/rewards/test_model_reward_run.py`` (runs with a reward model),
so they are left out here (:func:`walked_elsewhere`).  Free-form fields are one leaf each; the sub-keys
verl gives some of them (``global_profiler.tool``, ``ray_kwargs.ray_init``, ``data.sampler.class_path``, ...:
:data:`FREE_FORM_KEYS`) are probed one by one too, in a config-only test.  The module takes ~35 s on two
cores (four one-step runs).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import FAST, SMALL

import rlforge
import rlforge.config
from rlforge.config import schema, validate_config
from rlforge.config.later_work import later_work_warnings
from rlforge.config.root import RLForgeConfig
from rlforge.config.user_keys import record_user_keys, user_keys
from rlforge.errors import ConfigError

ROOTS = ("",)
"""The config nodes whose keys this test walks: the whole schema (``""`` = the root)."""

# ---------------------------------------------------------------------------------------------- the detector

NOT_CONSUMING: tuple[tuple[str, str], ...] = (
    ("rlforge/config/validate.py", "validate_config"),
    ("rlforge/config/later_work.py", "later_work_warnings"),
    ("rlforge/config/format.py", "format_config"),
    ("rlforge/trainer/ppo_trainer.py", "_config_dict"),
    ("rlforge/trainer/summary.py", "start_line"),  # the run's first line and its summary only print keys
    ("rlforge/trainer/summary.py", "end_lines"),
)
"""``(file, function)``: reads made inside these (and inside everything they call) check, print or
dump the config, so they do not make a key effective."""

_SKIPPED_DIRS = (os.path.dirname(__import__("omegaconf").__file__) + os.sep,)
_SKIPPED_FILES = (dataclasses.__file__, "<string>")  # asdict/replace/fields; the generated __eq__/__repr__


def schema_keys(cls: type, prefix: str) -> list[str]:
    """Every leaf key below dataclass ``cls``, dotted, starting with ``prefix``.

    A free-form field (a ``dict`` or ``Any``: ``override_config``, ``engine_kwargs``, ``profiler``,
    ``mixed_precision``, ``target_modules``, ...) is one leaf and is not descended into: its
    sub-keys are the user's, not the schema's, and the code hands the value on whole (to the HF
    config, the optimizer, ...) or not at all, so the field is what must be read or warned.
    """
    out: list[str] = []
    for name, tp in schema.field_types(cls).items():
        key = f"{prefix}.{name}" if prefix else name
        if schema.kind_of(tp) == "node":
            out.extend(schema_keys(schema.strip_optional(tp), key))
        else:
            out.append(key)
    return out


def node_class(root: type, dotted: str) -> type:
    return schema.strip_optional(schema.lookup(root, dotted)) if dotted else root


def walked_elsewhere(key: str) -> bool:
    """Keys that another module walks with runs of their own: the reward model's and the judge's
    (``tests/rewards/test_model_reward_run.py``, which leaves the reward-manager keys to this module)."""
    from rewards.test_model_reward_run import NOT_OURS

    return key.startswith("reward_model.") and not key.startswith(NOT_OURS)


def all_keys(root: type = RLForgeConfig) -> list[str]:
    return [k for node in ROOTS for k in schema_keys(node_class(root, node), node)]


def _instances(obj: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """``(dotted path, instance)`` for the dataclass ``obj`` and every dataclass instance below it."""
    yield prefix, obj
    for f in dataclasses.fields(obj):
        value = object.__getattribute__(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _instances(value, f"{prefix}.{f.name}" if prefix else f.name)


class ReadRecorder:
    """Records the consuming reads of config fields.

    :meth:`track` changes a config in place: each of its dataclass instances becomes an instance
    of a subclass whose ``__getattribute__`` notes reads of dataclass fields (``isinstance`` and
    ``dataclasses.fields`` still work).  :attr:`reads` holds the dotted keys read so far.
    """

    def __init__(self, not_consuming: tuple[tuple[str, str], ...] = NOT_CONSUMING) -> None:
        self.reads: set[str] = set()
        self._paths: dict[int, str] = {}
        self._alive: list[Any] = []  # the tracked instances stay alive, so their ids stay theirs
        self._subclasses: dict[type, type] = {}
        self._not_consuming = not_consuming

    def track(self, cfg: Any) -> Any:
        for path, obj in _instances(cfg, ""):
            self._paths[id(obj)] = path
            self._alive.append(obj)
            obj.__class__ = self._subclass(type(obj))
        return cfg

    def _subclass(self, cls: type) -> type:
        if cls in self._subclasses.values():
            return cls
        if cls not in self._subclasses:
            names = frozenset(f.name for f in dataclasses.fields(cls))
            note = self._note

            def __getattribute__(obj: Any, name: str) -> Any:  # noqa: N807
                value = object.__getattribute__(obj, name)
                if name in names:
                    note(obj, name)
                return value

            self._subclasses[cls] = type(f"Recording{cls.__name__}", (cls,), {"__getattribute__": __getattribute__})
        return self._subclasses[cls]

    def _note(self, obj: Any, name: str) -> None:
        base = self._paths.get(id(obj))
        if base is None:  # a copy the code made (dataclasses.replace): not the job's config
            return
        key = f"{base}.{name}" if base else name
        if key in self.reads:
            return
        frame = sys._getframe(2)  # 0 = _note, 1 = __getattribute__, 2 = the reader
        if frame.f_code.co_filename in _SKIPPED_FILES or frame.f_code.co_filename.startswith(_SKIPPED_DIRS):
            return
        while frame is not None:
            code = frame.f_code
            for path, func in self._not_consuming:
                if code.co_name == func and code.co_filename.replace(os.sep, "/").endswith(path):
                    return
            frame = frame.f_back
        self.reads.add(key)


def get_key(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def set_key(cfg: Any, dotted: str, value: Any) -> None:
    """Set ``dotted`` on ``cfg`` as a user would (an override): the key joins the keys the user set."""
    parent, _, leaf = dotted.rpartition(".")
    setattr(get_key(cfg, parent) if parent else cfg, leaf, value)
    if user_keys(cfg) is not None:
        record_user_keys(cfg, user_keys(cfg) | {dotted})


PROBES: dict[str, Any] = {
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": "torch",  # the one other valid value
}
"""Non-default values for keys where the generic :func:`probe_value` would not be one a user sets."""


def probe_value(root: type, key: str, default: Any) -> Any:
    """A value other than ``default`` of the type of ``key`` (a user setting the key)."""
    if key in PROBES:
        return PROBES[key]
    tp = schema.strip_optional(schema.lookup(root, key))
    if isinstance(default, bool) or tp is bool:
        return not default
    if isinstance(default, int) or tp is int:
        return 2 if default is None else default + 2
    if isinstance(default, float) or tp is float:
        return 0.5 if default is None else default + 0.25
    if isinstance(default, list) or typing.get_origin(tp) is list:
        return [*(default or []), 2 if typing.get_args(tp) in ((int,), (float,)) else "probe"]
    if isinstance(default, dict) or schema.kind_of(tp) == "free" and not isinstance(default, str):
        return {"probe": 1}
    return "probe" if default is None else f"{default}-probe"


def _refusal(cfg: Any) -> str:
    """The message of the ConfigError that validation raises for ``cfg``, or ``""``."""
    try:
        validate_config(cfg)
    except ConfigError as e:
        return str(e)
    return ""


def not_reported(cfg: Any, keys: list[str], warnings_of: Callable[[Any], list[str]] = later_work_warnings,
                 root: type = RLForgeConfig, refusal_of: Callable[[Any], str] | None = _refusal) -> list[str]:
    """The ``keys`` for which a non-default value set on ``cfg`` (one at a time, then put back) adds
    no warning line naming the key and, where ``refusal_of`` is given, is not refused by a
    validation error naming it (a combination that cannot work is an error, not a warning)."""
    base = set(warnings_of(cfg))
    silent = []
    for key in keys:
        old = get_key(cfg, key)
        set_key(cfg, key, probe_value(root, key, old))
        try:
            new = [w for w in warnings_of(cfg) if w not in base]
            reported = any(key in w for w in new) or (refusal_of is not None and key in refusal_of(cfg))
        finally:
            set_key(cfg, key, old)
        if not reported:
            silent.append(key)
    return silent


FREE_FORM_KEYS: dict[str, Any] = {
    "ray_kwargs.ray_init.num_cpus": 4,
    "ray_init.num_cpus": 4,
    "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space": 4,
    "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend": "triton",
    "actor_rollout_ref.rollout.engine_kwargs.trtllm.batch_wait_timeout_iters": 32,
    "global_profiler.global_tool_config.nsys.worker_nsight_options.sample": "none",
    "global_profiler.global_tool_config.torch_memory.kw_args.device": 0,
}
"""Sub-keys a user gives the fields that verl too keeps free-form (``ray.init`` arguments, engine arguments per
backend, nsys options), each with a value a user sets.  Set alone, each one warns.  The blocks verl types
(profilers, ``multi_turn``, ``agent``, ...) are typed here too, so the schema walk covers their leaves
(:data:`TYPED_VERL_BLOCKS`)."""

TYPED_VERL_BLOCKS = (
    "global_profiler", "ray_kwargs", "data.sampler", "data.datagen", "reward_model.sandbox_fusion",
    *(f"{node}.profiler" for node in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout",
                                      "critic", "reward_model")),
    *(f"actor_rollout_ref.rollout.{b}" for b in ("multi_turn", "agent", "trace", "engine_kwargs")),
)
"""Blocks that verl types and rlforge once took free-form: :func:`test_typed_verl_blocks_warn_leaf_by_leaf`
sets each of their leaves alone (config only, no run)."""

FREE_FORM_EFFECTS: dict[str, str] = {
    "global_profiler.tool": "tests/perf/test_verl_profiler.py::test_global_profiler_torch_steps_reach_the_monitor",
    "global_profiler.steps": "tests/perf/test_verl_profiler.py::test_global_profiler_torch_steps_reach_the_monitor",
    "global_profiler.save_path": "tests/perf/test_verl_profiler.py::test_global_profiler_torch_steps_reach_the_monitor",
}
"""verl profiler keys that take effect together with others (``global_profiler.tool=torch`` with ``steps`` and
``save_path``: torch.profiler traces of those steps in that folder): ``key -> the test that shows the effect``."""


def _get_free(cfg: Any, dotted: str) -> tuple[dict, str]:
    """The dict that holds the free-form sub-key ``dotted`` (created on the way where missing) and its name."""
    parts = dotted.split(".")
    node = cfg
    for i, part in enumerate(parts[:-1]):
        child = node.get(part) if isinstance(node, dict) else getattr(node, part)
        if child is None and isinstance(node, dict):
            child = node[part] = {}
        if not dataclasses.is_dataclass(child) and not isinstance(child, dict):
            raise AssertionError(f"{'.'.join(parts[:i + 1])} is not a node or a free-form field")
        node = child
    assert isinstance(node, dict), f"{dotted}: its parent is not a free-form field"
    return node, parts[-1]


def _free_form_head(key: str) -> str:
    """The free-form field of the schema above the sub-key ``key`` (``ray_kwargs`` for ``ray_kwargs.ray_init``)."""
    parts = key.split(".")
    return next(h for h in (".".join(parts[:i]) for i in range(1, len(parts)))
                if schema.kind_of(schema.lookup(RLForgeConfig, h)) == "free")


def free_form_not_reported(cfg: Any, keys: dict[str, Any]) -> list[str]:
    """The free-form sub-keys of ``keys`` (``key -> value``) that, set alone on ``cfg`` (then taken out
    again), add no warning naming them (the sub-key, or its free-form field with the sub-key's name in the
    value shown) and are not refused by an error naming them (as :func:`not_reported`)."""
    import copy

    base = set(later_work_warnings(cfg))
    silent = []
    for key in keys:
        head = _free_form_head(key)
        old = copy.deepcopy(get_key(cfg, head))
        parent, leaf = _get_free(cfg, key)
        parent[leaf] = keys[key]
        given = user_keys(cfg)
        if given is not None:  # set as a user would: the key joins the keys the user set
            record_user_keys(cfg, given | {key})
        try:
            new = [w for w in later_work_warnings(cfg) if w not in base]
            named = [w for w in new if key in w or (f"{head}=" in w and leaf in w)]
            if not named and key not in _refusal(cfg):
                silent.append(key)
        finally:
            set_key(cfg, head, old)
            if given is not None:
                record_user_keys(cfg, given)
    return silent


# ---------------------------------------------------------------------------------------------- the runs

A, REF, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout", "actor_rollout_ref.model"

RUNS: dict[str, list[str]] = {
    # GRPO on the native rollout, FSDP2: reference (KL loss), validation, checkpoints, the epoch count,
    # a cosine schedule, the deprecated global micro-batch keys, offload of the actor's optimizer
    # state (parameter offload is refused on a CPU run: test_offload_keys_take_effect builds it).
    "native_fsdp2": [
        "trainer.total_training_steps=null", "trainer.total_epochs=1", "data.builtin.train_size=4",
        f"{A}.use_kl_loss=true", "trainer.val_before_train=true", "trainer.test_freq=1",
        f"{R}.val_kwargs.do_sample=true", f"{R}.val_kwargs.temperature=0.7", f"{R}.val_kwargs.top_k=5",
        f"{R}.val_kwargs.top_p=0.9", f"{R}.val_kwargs.n=2", "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=1",
        f"{A}.checkpoint.save_contents=[model,optimizer,extra,hf_model]", f"{A}.optim.lr_scheduler_type=cosine",
        f"{A}.ppo_micro_batch_size_per_gpu=null", f"{A}.ppo_micro_batch_size=2",
        f"{R}.log_prob_micro_batch_size_per_gpu=null", f"{R}.log_prob_micro_batch_size=4",
        f"{REF}.log_prob_micro_batch_size_per_gpu=null", f"{REF}.log_prob_micro_batch_size=4",
        f"{A}.fsdp_config.optimizer_offload=true", f"{A}.use_torch_compile=true",
    ],
    # GAE with a critic, KL in the reward, the hf rollout, FSDP1 for actor, reference and critic.
    "gae_hf_fsdp1": [
        "trainer.total_training_steps=1", "algorithm.adv_estimator=gae", "critic.model.path=preset:tiny",
        "algorithm.use_kl_in_reward=true", f"{R}.name=hf", f"{A}.strategy=fsdp", "critic.strategy=fsdp",
        "critic.optim.lr_scheduler_type=cosine", "critic.ppo_micro_batch_size=2",
        "critic.forward_micro_batch_size_per_gpu=null", "critic.forward_micro_batch_size=4",
        f"{A}.use_torch_compile=false", "algorithm.kl_ctrl.type=adaptive", "data.validation_shuffle=true",
    ],
    # FlowRL (log-Z head, its learning rate) on FSDP2, exporting a Hugging Face folder with the head.
    "flowrl": ["trainer.total_training_steps=1", f"{A}.policy_loss.loss_mode=flowrl", "trainer.save_freq=1",
               f"{A}.checkpoint.save_contents=[model,optimizer,extra,hf_model]", f"{A}.policy_loss.flowrl.export_log_z=true"],
    # rollout correction in verl's bypass mode (weights and rejection per micro-batch, REINFORCE loss).
    "rollout_correction_bypass": [
        "trainer.total_training_steps=1", "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.loss_type=reinforce", "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=3.0",
        "algorithm.rollout_correction.rollout_is_batch_normalize=true",
        "algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",
    ],
    # strategy=megatron (PyTorch TP/PP/FSDP2 on a one-rank mesh) for actor, reference and critic.
    "megatron": [
        "trainer.total_training_steps=1", f"{A}.strategy=megatron", f"{A}.use_kl_loss=true",
        "algorithm.adv_estimator=gae", "critic.model.path=preset:tiny", "critic.strategy=megatron",
    ],
}
"""Each run: ``rlforge train`` (the embedded default job) with ``tests/helpers.py``'s SMALL and FAST
arguments, then these; one training step."""

BACKENDS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "rollout": (f"{R}.name", ("native", "hf"), (f"{R}.",)),
    # the reference's and the critic's fsdp_config / megatron rows come from the same generators
    "engine": (f"{A}.strategy", ("fsdp", "fsdp2", "megatron"), (f"{A}.fsdp_config.", f"{A}.megatron.")),
}
"""Per-mode check: ``kind -> (mode key, its values, key prefixes)``.  Each backend is built from a
recording config (the rollout also generates; the engine is constructed), and every key under the
prefixes that one value reads and another does not must warn under the other."""

READ_ELSEWHERE: dict[str, tuple[str, str]] = {
    # Sizes the KV cache from the GPU's memory: the native rollout reads it on CUDA only.
    f"{R}.gpu_memory_utilization": ("CUDA (native rollout)", "rlforge/rollout/native/engine.py"),
    # DAPO's dynamic sampling: a one-step run on an untrained model keeps no group (zero reward spread).
    **{f"algorithm.filter_groups.{k}": ("algorithm.filter_groups.enable=true", "rlforge/trainer/ppo_trainer.py")
       for k in ("metric", "max_num_gen_batches", "proceed_on_limit")},
    # The target of builtin:distribution (FlowRL's toy task; tests/data/test_data_builtin.py).
    **{f"data.builtin.distribution.{k}": ("data.train_files=builtin:distribution", "rlforge/data/tasks/distribution.py")
       for k in ("weights", "means", "width", "low", "high")},
    "data.builtin.distribution.invalid_reward": ("data.train_files=builtin:distribution", "rlforge/rewards/rules.py"),
    # DAPO's overlong penalty (tests/rewards).
    **{f"reward_model.overlong_buffer.{k}": ("reward_model.overlong_buffer.enable=true", "rlforge/rewards/managers.py")
       for k in ("len", "penalty_factor")},
}
"""Keys no CPU run here can read: ``key -> (the mode that reads it, the file that reads it)``."""

CANARIES = ("trainer.ray_wait_register_center_timeout", f"{M}.use_shm")
"""Keys documented as having no effect: a run that 'reads' them reads the whole config (a dump that
:data:`NOT_CONSUMING` misses), which would make every key look consumed."""


@dataclass
class Run:
    overrides: list[str]
    reads: set[str]
    jobs: list[Any] = field(default_factory=list)


@dataclass
class Spies:
    compiled: list[int] = field(default_factory=list)          # id() of modules given to compile_layers
    offload_policy: dict[int, str] = field(default_factory=dict)  # id(root module) -> FSDP2 offload policy class


def _overrides(name: str, tmp: Path) -> list[str]:
    return [*SMALL, *FAST, f"trainer.default_local_dir={tmp / name}", *RUNS[name]]


@pytest.fixture(autouse=True)
def _one_rank_group() -> Iterator[None]:
    """The engines built directly here need the process group a job would create
    (``init_single_process``); tests/conftest.py destroys it after each test."""
    from rlforge.engine.distributed import init_single_process

    init_single_process(torch.device("cpu"))
    yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[tuple[dict[str, Run], Spies]]:
    """Every run of :data:`RUNS`, recorded, plus one call of each policy loss.  The one-rank process
    group the runs join is destroyed afterwards when it was not there before (later tests expect none)."""
    import torch.distributed as dist

    had_group = dist.is_initialized()
    yield _record_runs(tmp_path_factory)
    if not had_group and dist.is_initialized():
        dist.destroy_process_group()


def _record_runs(tmp_path_factory) -> tuple[dict[str, Run], Spies]:
    import rlforge.engine.compile as compile_mod
    import rlforge.engine.fsdp2 as fsdp2_mod
    import rlforge.trainer.ppo_trainer as trainer_mod
    from rlforge.cli import run_train

    tmp = tmp_path_factory.mktemp("runs")
    real_load, real_build = rlforge.config.load_config, trainer_mod.build_job
    real_compile, real_shard = compile_mod.compile_layers, fsdp2_mod.fully_shard
    spies, out = Spies(), {}

    def compile_spy(module, device):
        spies.compiled.append(id(module))
        return real_compile(module, device)

    def shard_spy(module, **kw):
        spies.offload_policy[id(module)] = type(kw.get("offload_policy")).__name__
        return real_shard(module, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compile_mod, "compile_layers", compile_spy)
        mp.setattr(fsdp2_mod, "fully_shard", shard_spy)
        for name in RUNS:
            run = out[name] = Run(_overrides(name, tmp), set())
            recorder = ReadRecorder()
            mp.setattr(rlforge.config, "load_config", lambda *a, _r=recorder, **k: _r.track(real_load(*a, **k)))
            mp.setattr(trainer_mod, "build_job", lambda cfg, _run=run: _run.jobs.append(real_build(cfg)) or _run.jobs[-1])
            assert run_train(run.overrides, None, "default", False) == 0, name
            run.reads = recorder.reads
    out["policy_losses"] = Run([], _policy_loss_reads())
    return out, spies


def _policy_loss_reads() -> set[str]:
    """Each registered policy loss called once on random tensors with a recording actor config."""
    from rlforge.algorithms import POLICY_LOSSES, PolicyLossInputs

    recorder = ReadRecorder()
    cfg = recorder.track(rlforge.config.load_config())
    g = torch.Generator().manual_seed(0)
    b, t = 4, 5
    object.__setattr__(cfg.actor_rollout_ref.actor.policy_loss, "dro_beta", 0.05)  # loss_mode=dro needs one
    for mode in POLICY_LOSSES.names():
        object.__setattr__(cfg.actor_rollout_ref.actor.policy_loss, "loss_mode", mode)
        logp = torch.randn(b, t, generator=g, requires_grad=True)
        inputs = PolicyLossInputs(
            old_log_prob=logp.detach() + 0.1, log_prob=logp, advantages=torch.randn(b, t, generator=g),
            response_mask=torch.ones(b, t), ref_log_prob=logp.detach() - 0.1,
            token_level_rewards=torch.randn(b, t, generator=g), index=np.array(["a", "a", "b", "b"], dtype=object),
            log_z=torch.zeros(b, requires_grad=True),
        )
        POLICY_LOSSES.get(mode)(inputs, cfg.actor_rollout_ref.actor)
    return recorder.reads


def _fresh(run: Run) -> RLForgeConfig:
    return rlforge.config.load_config(run.overrides, job="default")


# ---------------------------------------------------------------------------------------------- the checks


@pytest.mark.e2e
def test_every_key_is_consumed_or_warned(runs) -> None:
    out, _ = runs
    read = set().union(*(r.reads for r in out.values()))
    unread = [k for k in all_keys() if k not in read and k not in READ_ELSEWHERE and not walked_elsewhere(k)]
    silent = not_reported(_fresh(out["native_fsdp2"]), unread)
    assert not silent, (
        "config keys that no run reads and that no LATER_WORK row warns about (make them work, or add a "
        f"row to rlforge/config/later_work.py): {silent}")


def test_free_form_sub_keys_warn_or_take_effect() -> None:
    """Every sub-key verl gives a free-form field warns when set alone (taking effect only together
    with others, where a test shows it); each one lies below a free-form field of the schema."""
    for key in FREE_FORM_KEYS:
        _free_form_head(key)  # raises StopIteration when no free-form field is above it
    silent = free_form_not_reported(rlforge.config.load_config(), FREE_FORM_KEYS)
    assert not silent, f"free-form sub-keys that change nothing and warn about nothing: {silent}"
    root = Path(rlforge.__file__).parent.parent
    for key, test in FREE_FORM_EFFECTS.items():
        path, _, name = test.partition("::")
        assert key in all_keys() and f"def {name}(" in (root / path).read_text(), (key, test)


def test_typed_verl_blocks_warn_leaf_by_leaf() -> None:
    """Each leaf of the blocks verl types, set alone to a non-default value, warns naming it (the e2e walk
    also counts reads; these blocks are read by no run, or only to be checked)."""
    keys = [k for k in all_keys() if k.startswith(tuple(f"{b}." for b in TYPED_VERL_BLOCKS))]
    assert len(keys) >= 90, len(keys)  # 5 profilers x 12 + global 9 + multi_turn 15 + agent 6 + ...
    assert "actor_rollout_ref.rollout.engine_kwargs.vllm" in keys  # free-form as in verl: one leaf
    assert "actor_rollout_ref.actor.profiler.tool_config.npu.level" in keys
    silent = not_reported(rlforge.config.load_config(), keys)
    assert not silent, f"leaves of verl's typed blocks that change nothing and warn about nothing: {silent}"


def test_whole_schema_is_walked() -> None:
    """The walk covers every top-level section of the schema, not only the actor, critic and trainer."""
    keys = all_keys()
    for section in ("data.", "algorithm.", "custom_reward_function.", "reward_model.reward_manager",
                    "actor_rollout_ref.nccl_timeout", "global_profiler", "ray_kwargs"):
        assert any(k.startswith(section) for k in keys), section
    assert walked_elsewhere("reward_model.judge.path") and not walked_elsewhere("reward_model.sandbox_fusion.url")
    for typed in ("actor_rollout_ref.rollout.multi_turn.max_user_turns", "critic.profiler.tool_config.torch.contents",
                  "actor_rollout_ref.rollout.agent.custom_async_server.path", "global_profiler.steps"):
        assert typed in keys, typed
    assert "actor_rollout_ref.rollout.multi_turn" not in keys  # a node now, walked leaf by leaf


def _backend_reads(kind: str, value: str, model: torch.nn.Module, tokenizer: Any) -> set[str]:
    """The keys read while building the ``kind`` backend ``value`` (and generating, for a rollout)."""
    import copy

    from helpers import text_prompts

    from rlforge.engine import ENGINES
    from rlforge.rollout import ROLLOUTS, SamplingParams

    mode_key, _, _ = BACKENDS[kind]
    recorder = ReadRecorder()
    arr = recorder.track(rlforge.config.load_config([f"{mode_key}={value}", f"{R}.tensor_model_parallel_size=1"]))
    arr = arr.actor_rollout_ref
    cpu = torch.device("cpu")
    if kind == "rollout":
        rollout = ROLLOUTS.get(value).from_config(copy.deepcopy(model), [tokenizer.eos_token_id],
                                                  tokenizer.pad_token_id, cpu, None, arr.rollout)
        rollout.generate(text_prompts(tokenizer, ["1+1=", "2+3="]), SamplingParams(max_new_tokens=3))
    else:
        ENGINES.get(value)(copy.deepcopy(model).train(), cpu, fsdp_config=arr.actor.fsdp_config,
                           optim_cfg=arr.actor.optim, megatron_config=arr.actor.megatron, role_key=A)
    return recorder.reads


@pytest.mark.e2e
@pytest.mark.parametrize("kind", BACKENDS)
def test_backend_specific_keys_warn_under_the_other_backends(runs, kind, tiny_model, tiny_tokenizer) -> None:
    mode_key, values, prefixes = BACKENDS[kind]
    reads = {v: _backend_reads(kind, v, tiny_model, tiny_tokenizer) for v in values}
    leaves = set(all_keys())
    for other in values:
        only = sorted(k for v in values for k in reads[v] - reads[other] if k.startswith(prefixes) and k in leaves)
        silent = not_reported(rlforge.config.load_config([f"{mode_key}={other}"]), list(dict.fromkeys(only)))
        assert not silent, f"read by another {mode_key} but ignored without a warning under {mode_key}={other}: {silent}"


@pytest.mark.e2e
def test_read_elsewhere_table_is_needed_and_real(runs) -> None:
    out, _ = runs
    read = set().union(*(r.reads for r in out.values()))
    root = Path(rlforge.__file__).parent.parent
    for key, (mode, path) in READ_ELSEWHERE.items():
        assert key in all_keys(), f"READ_ELSEWHERE names {key}, which is not a config key"
        assert key not in read, f"{key} is read by a run here; remove it from READ_ELSEWHERE"
        leaf = key.rpartition(".")[2]
        assert leaf in (root / path).read_text(), f"{key}: {path} (said to read it under {mode}) never names '{leaf}'"


@pytest.mark.e2e
def test_offload_keys_take_effect(runs, tiny_model) -> None:
    """``optimizer_offload`` gives the actor host-resident optimizer state; ``offload_policy`` makes the
    FSDP2 engine shard with ``CPUOffloadPolicy`` on an accelerator: seen at its first ``fully_shard``
    call, where the build is stopped (``param_offload``, verl's phase offload, does not: its effect is
    tested in ``tests/engine/test_param_offload.py``).  On a CPU run (nothing to offload to; FSDP's CPU offload needs
    an accelerator) it is left off, with one warning."""
    import copy

    from rlforge.config import FSDPConfig
    from rlforge.engine import ENGINES

    out, spies = runs
    (job,) = out["native_fsdp2"].jobs
    assert job.actor.engine.offloaded is not None, "actor.fsdp_config.optimizer_offload=true: no host-resident state"
    assert spies.offload_policy[id(job.actor.engine.module)] != "CPUOffloadPolicy"  # param_offload=false
    (flow,) = out["flowrl"].jobs
    assert flow.actor.engine.offloaded is None  # optimizer_offload=false (the default)
    warnings = validate_config(rlforge.config.load_config(
        ["trainer.device=cpu", f"{A}.strategy=fsdp2", f"{A}.fsdp_config.param_offload=true"]))
    assert [w for w in warnings if "param_offload" in w and "running without offload" in w], warnings
    import rlforge.engine.fsdp2 as fsdp2_mod

    class Sharded(Exception):
        """Stops the build at the first fully_shard: CPUOffloadPolicy needs an accelerator."""

    def shard_spy(module, **kw):
        raise Sharded(type(kw.get("offload_policy")).__name__)

    for offload_policy, policy in ((True, "OffloadPolicy"), (False, "OffloadPolicy")):  # CPU: never offloaded
        with pytest.MonkeyPatch.context() as mp, pytest.raises(Sharded) as info:
            mp.setattr(fsdp2_mod, "fully_shard", shard_spy)
            ENGINES.get("fsdp2")(copy.deepcopy(tiny_model), torch.device("cpu"),
                                 fsdp_config=FSDPConfig(offload_policy=offload_policy), optim_cfg=None)
        assert str(info.value) == policy, (offload_policy, str(info.value))
    # on an accelerator offload_policy reaches fully_shard (the spy stops the build before any device work);
    # param_offload does not (it moves the parameters between phases instead)
    with pytest.MonkeyPatch.context() as mp, pytest.raises(Sharded) as info:
        mp.setattr(fsdp2_mod, "fully_shard", shard_spy)
        fsdp2_mod.parallelize_fsdp2(copy.deepcopy(tiny_model), FSDPConfig(offload_policy=True), torch.device("cuda"),
                                    mesh=None)
    assert str(info.value) == "CPUOffloadPolicy"
    from rlforge.engine.sharded import cpu_offload_applies

    assert not cpu_offload_applies(FSDPConfig(param_offload=True), torch.device("cuda"))


@pytest.mark.e2e
def test_torch_compile_reaches_the_engine(runs) -> None:
    out, spies = runs
    (on,) = out["native_fsdp2"].jobs    # use_torch_compile: true (the default)
    (off,) = out["gae_hf_fsdp1"].jobs   # use_torch_compile: false
    assert id(on.actor.engine.module) in spies.compiled or any(
        id(m) in spies.compiled for m in on.actor.engine.module.modules()), "use_torch_compile=true: nothing compiled"
    assert not any(id(m) in spies.compiled for m in off.actor.engine.module.modules())


@pytest.mark.parametrize("key, value, text", [
    (f"{M}.lora_rank", 8, None),  # effective (rlforge.models.lora): no warning
    ("critic.model.lora_rank", 8, None),
    (f"{M}.use_liger", True, f"{M}.use_liger"),
    (f"{A}.use_torch_compile", False, None),  # effective (regional compile on CUDA): no warning either way
    (f"{A}.fsdp_config.param_offload", True, None),  # effective on one process too: no warning
    (f"{A}.fsdp_config.optimizer_offload", True, None),
])
def test_key_warning_text(key, value, text) -> None:
    cfg = rlforge.config.load_config()
    base = set(later_work_warnings(cfg))
    set_key(cfg, key, value)
    new = [w for w in later_work_warnings(cfg) if w not in base]
    if text is None:
        assert not [w for w in new if key in w], new
    else:
        assert any(key in w and text in w for w in new), new


@pytest.mark.parametrize("extra, warned", [
    ({}, True),  # the agent loop with nothing to call and nobody to answer: one assistant turn, as without it
    ({"tool_config_path": "builtin:calculator"}, False),
    ({"interaction_config_path": "interactions.yaml"}, False),
])
def test_multi_turn_without_tools_or_interactions_warns(extra, warned) -> None:
    key = "actor_rollout_ref.rollout.multi_turn.enable"
    cfg = rlforge.config.load_config()
    assert not [w for w in later_work_warnings(cfg) if key in w]  # off by default: silent
    from rlforge.config.rollout import MultiTurnSchema

    set_key(cfg, "actor_rollout_ref.rollout.multi_turn", MultiTurnSchema(enable=True, **extra))
    hits = [w for w in later_work_warnings(cfg) if key in w]
    assert bool(hits) is warned, hits
    if warned:
        assert "tool_config_path" in hits[0] and "one assistant turn" in hits[0]


def test_critic_keys_warn_when_no_critic_trains() -> None:
    """GRPO trains no critic: critic keys set away from their defaults are named in one warning; keys that only
    follow the actor's (``critic.ppo_epochs`` is ``${actor...ppo_epochs}``) are not; with gae they take effect."""
    def hits(overrides: list[str]) -> list[str]:
        return [w for w in later_work_warnings(rlforge.config.load_config(overrides)) if "trains no critic" in w]

    grpo = "algorithm.adv_estimator=grpo"
    got = hits([grpo, "critic.model.lora_rank=8", "critic.optim.lr=0.5", "critic.ppo_epochs=3"])
    assert len(got) == 1 and all(k in got[0] for k in ("critic.model.lora_rank", "critic.optim.lr",
                                                       "critic.ppo_epochs")), got
    assert hits([grpo, "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.use_dynamic_bsz=true"]) == []
    assert hits(["algorithm.adv_estimator=gae", "critic.model.lora_rank=8", "critic.optim.lr=0.5"]) == []
    assert hits([grpo, "critic.enable=false", "critic.optim.lr=0.5"])


# ---------------------------------------------------------------------------------------------- self-checks


@dataclass
class _ToyInner:
    used: int = 1
    dead: float = 0.5


@dataclass
class _Toy:
    inner: _ToyInner = field(default_factory=_ToyInner)
    warned: str = "a"
    extras: dict[str, Any] = field(default_factory=dict)


def _toy_validate(cfg: _Toy) -> None:
    """Stands for validate_config: its reads do not count."""
    assert cfg.inner.dead >= 0


def _toy_warnings(cfg: _Toy) -> list[str]:
    return [f"warned={cfg.warned}: ignored"] if cfg.warned != "a" else []


def test_detector_finds_an_unread_unwarned_key() -> None:
    recorder = ReadRecorder(not_consuming=(("tests/config/test_no_silent_keys.py", "_toy_validate"),))
    cfg = recorder.track(_Toy())
    _toy_validate(cfg)
    _ = dataclasses.asdict(cfg), repr(cfg), cfg == _Toy()  # bulk reads of the dataclass machinery
    assert cfg.inner.used + 1 == 2 and isinstance(cfg, _Toy) and isinstance(cfg.inner, _ToyInner)
    assert recorder.reads == {"inner", "inner.used"}
    keys = schema_keys(_Toy, "")
    assert keys == ["inner.used", "inner.dead", "warned", "extras"]
    unread = [k for k in keys if k not in recorder.reads]
    assert not_reported(_Toy(), unread, _toy_warnings, _Toy, None) == ["inner.dead", "extras"]


@pytest.mark.e2e
def test_detector_finds_a_made_up_key_and_a_lost_read(runs) -> None:
    out, _ = runs
    read = set().union(*(r.reads for r in out.values()))
    # a made-up key in a copy of the schema
    from rlforge.config.actor import ActorRolloutRefConfig, ModelConfig

    model_plus = dataclasses.make_dataclass("ModelPlus", [("made_up_key", int, 0)], bases=(ModelConfig,))
    arr_plus = dataclasses.make_dataclass(
        "ArrPlus", [("model", model_plus, field(default_factory=model_plus))], bases=(ActorRolloutRefConfig,))
    root_plus = dataclasses.make_dataclass(
        "RootPlus", [("actor_rollout_ref", arr_plus, field(default_factory=arr_plus))], bases=(RLForgeConfig,))
    assert f"{M}.made_up_key" in all_keys(root_plus) and f"{M}.made_up_key" not in read
    cfg = _fresh(out["native_fsdp2"])
    model = cfg.actor_rollout_ref.model
    cfg.actor_rollout_ref.model = model_plus(**{f.name: getattr(model, f.name) for f in dataclasses.fields(model)})
    assert not_reported(cfg, [f"{M}.made_up_key", f"{M}.use_shm"], root=root_plus) == [f"{M}.made_up_key"]
    # an existing, consumed key that the code stopped reading
    assert not_reported(_fresh(out["native_fsdp2"]), [f"{A}.ppo_epochs"]) == [f"{A}.ppo_epochs"]
    assert f"{A}.ppo_epochs" in read


@pytest.mark.e2e
def test_runs_do_not_read_the_whole_config(runs) -> None:
    out, _ = runs
    for name, run in out.items():
        assert not run.reads & set(CANARIES), f"run {name} read {run.reads & set(CANARIES)}: a bulk read is counted"
