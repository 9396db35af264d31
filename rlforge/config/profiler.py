"""verl's profiler blocks, typed as verl types them (``verl/utils/profiler/config.py``, ``ProfilerConfig`` and
the per-tool configs; key names and defaults of ``_generated_ppo_trainer.yaml``).

Two kinds of block: the root ``global_profiler`` (:class:`GlobalProfilerConfig`: ``tool=torch`` with ``steps``
records those steps with torch.profiler, :mod:`rlforge.perf.verl_profiler`) and one per role
(``actor_rollout_ref.{actor,ref,rollout}.profiler``, ``critic.profiler``, ``reward_model.profiler``:
:class:`RoleProfilerConfig`), whose defaults follow the global block as in verl.  rlforge's recording covers
every role of a step, so a per-role setting that differs from what it follows warns
(:mod:`rlforge.config.later_work`).  Free-form only where verl's are: the nsys option dicts
(``controller_nsight_options``, ``worker_nsight_options``) and ``torch_memory.kw_args``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

_GTC = "global_profiler.global_tool_config"


def _nsight_options(capture: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}
    if capture:
        out |= {"capture-range": "cudaProfilerApi", "capture-range-end": None, "kill": "none"}
    return out


@dataclass
class GlobalNsysConfig:
    """``global_profiler.global_tool_config.nsys`` (Nsight Systems; not run by rlforge)."""

    discrete: bool = False
    """One nsys report per profiled role and step (verl)."""
    controller_nsight_options: dict[str, Any] = field(default_factory=lambda: _nsight_options(False))
    """Free-form ``nsys profile`` options of verl's controller process."""
    worker_nsight_options: dict[str, Any] = field(default_factory=lambda: _nsight_options(True))
    """Free-form ``nsys profile`` options of verl's worker processes."""


@dataclass
class GlobalTorchMemoryConfig:
    """``global_profiler.global_tool_config.torch_memory`` (CUDA memory snapshots; not run by rlforge)."""

    trace_alloc_max_entries: int = 100000
    """Allocation events kept in the snapshot."""
    stack_depth: int = 32
    """Frames kept per allocation."""
    context: str = "all"
    """``torch.cuda.memory._record_memory_history`` context: ``alloc`` | ``state`` | ``all``."""
    stacks: str = "all"
    """``python`` | ``all`` (with C++ frames)."""
    kw_args: dict[str, Any] = field(default_factory=dict)
    """Free-form extra keyword arguments of ``_record_memory_history``."""


@dataclass
class GlobalToolConfig:
    """``global_profiler.global_tool_config``: options of verl's profilers shared by every role."""

    nsys: GlobalNsysConfig = field(default_factory=GlobalNsysConfig)
    """Nsight Systems."""
    torch_memory: GlobalTorchMemoryConfig = field(default_factory=GlobalTorchMemoryConfig)
    """CUDA memory snapshots."""


@dataclass
class GlobalProfilerConfig:
    """verl's root ``global_profiler`` block (:mod:`rlforge.perf.verl_profiler` maps and warns)."""

    tool: str | None = None
    """``torch`` (rlforge records ``steps`` with torch.profiler) | ``nsys`` | ``npu`` | ``torch_memory`` (verl's
    others: warned) | null = no profiler."""
    steps: list[int] | None = None
    """Global steps (1-based) to profile; null = none."""
    profile_continuous_steps: bool = False
    """verl: one trace over consecutive steps (rlforge writes one per step: warned)."""
    save_path: str | None = None
    """Folder of the torch.profiler files; null = ``<trainer.default_local_dir>/trace`` (verl's YAML gives
    ``outputs/profile``)."""
    global_tool_config: GlobalToolConfig = field(default_factory=GlobalToolConfig)
    """Per-tool options (nsys, torch_memory)."""


@dataclass
class NsysToolConfig:
    """``profiler.tool_config.nsys`` of one role."""

    discrete: bool = II(f"oc.select:{_GTC}.nsys.discrete,false")
    """One report per role and step; follows ``global_profiler.global_tool_config.nsys.discrete``."""


@dataclass
class NpuToolConfig:
    """``profiler.tool_config.npu`` of one role (Ascend NPUs; rlforge has none)."""

    contents: list[str] = field(default_factory=list)
    """What to collect."""
    level: str = "level0"
    """Collection level."""
    analysis: bool = True
    """Analyse the collected data."""
    discrete: bool = False
    """One report per role and step."""


@dataclass
class TorchToolConfig:
    """``profiler.tool_config.torch`` of one role."""

    contents: list[str] = field(default_factory=list)
    """What torch.profiler records for this role (verl: ``cpu``, ``cuda``, ``memory``, ``shapes``, ``stack``)."""
    discrete: bool = False
    """One trace per role and step."""


@dataclass
class TorchMemoryToolConfig:
    """``profiler.tool_config.torch_memory`` of one role."""

    trace_alloc_max_entries: int = II(f"oc.select:{_GTC}.torch_memory.trace_alloc_max_entries,100000")
    """Follows the global block's."""
    stack_depth: int = II(f"oc.select:{_GTC}.torch_memory.stack_depth,32")
    """Follows the global block's."""


@dataclass
class ToolConfig:
    """``profiler.tool_config`` of one role: options per tool."""

    nsys: NsysToolConfig = field(default_factory=NsysToolConfig)
    """Nsight Systems."""
    npu: NpuToolConfig = field(default_factory=NpuToolConfig)
    """Ascend NPU profiler."""
    torch: TorchToolConfig = field(default_factory=TorchToolConfig)
    """torch.profiler."""
    torch_memory: TorchMemoryToolConfig = field(default_factory=TorchMemoryToolConfig)
    """CUDA memory snapshots."""


@dataclass
class RoleProfilerConfig:
    """``profiler`` of the actor, the reference and the critic (verl's per-role ``ProfilerConfig``).

    rlforge records whole steps, every role in them (``global_profiler.tool=torch`` with ``steps``, or
    ``trainer.profile_steps``); a value that differs from what it follows warns."""

    tool: str | None = II("oc.select:global_profiler.tool,null")
    """Profiler of this role; follows ``global_profiler.tool``."""
    enable: bool = False
    """Profile this role (verl)."""
    all_ranks: bool = False
    """Profile every rank of this role (verl)."""
    ranks: list[int] = field(default_factory=list)
    """Ranks of this role to profile (verl)."""
    save_path: str | None = II("oc.select:global_profiler.save_path,null")
    """Folder of this role's traces; follows ``global_profiler.save_path``."""
    tool_config: ToolConfig = field(default_factory=ToolConfig)
    """Options per tool."""


_ACTOR = "actor_rollout_ref.actor.profiler"


@dataclass
class FollowerProfilerConfig(RoleProfilerConfig):
    """``profiler`` of the rollout and the reward model: ``enable``, ``all_ranks``, ``ranks`` and
    ``tool_config`` follow the actor's (as in verl's YAML)."""

    enable: bool = II(f"oc.select:{_ACTOR}.enable,false")
    """Follows the actor's."""
    all_ranks: bool = II(f"oc.select:{_ACTOR}.all_ranks,false")
    """Follows the actor's."""
    ranks: list[int] = II(f"oc.select:{_ACTOR}.ranks,[]")
    """Follows the actor's."""
    tool_config: ToolConfig = II(f"oc.select:{_ACTOR}.tool_config,null")
    """Follows the actor's."""


def follower_profiler(reward_model: bool = False) -> FollowerProfilerConfig:
    """The rollout's profiler block; ``reward_model``: the reward model's, whose ``enable``, ``all_ranks`` and
    ``ranks`` are its own (verl's YAML gives them as plain defaults)."""
    if not reward_model:
        return FollowerProfilerConfig()
    return FollowerProfilerConfig(enable=False, all_ranks=False, ranks=[])
