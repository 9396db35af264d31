"""``data.*``: datasets, prompt/response lengths and batch sizes (verl key names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DistributionTaskConfig:
    """Target of ``builtin:distribution``: p*(x) ∝ Σ_k w_k exp(-(x - μ_k)² / width) on the
    integers ``low..high`` (FlowRL, Zhu et al. 2025, §5 toy experiment)."""

    weights: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.25])
    """Mixture weights w_k (need not sum to 1; the target is normalised)."""
    means: list[float] = field(default_factory=lambda: [20.0, 50.0, 80.0])
    """Mixture centres μ_k (same length as ``weights``)."""
    width: float = 10.0
    """Denominator of the exponent (2σ²): exp(-(x - μ)² / width)."""
    low: int = 1
    """Smallest valid answer."""
    high: int = 100
    """Largest valid answer."""
    invalid_reward: float = -50.0
    """Reward (log-space) of an answer that is not an integer in ``low..high``."""


@dataclass
class BuiltinTaskConfig:
    """rlforge addition: generated tasks selected with ``data.train_files=builtin:<task>``."""

    difficulty: Any = 1
    """Task difficulty: one level (>= 1; ``arithmetic`` has 1-5, see :mod:`rlforge.data.tasks.arithmetic`), or a
    list of levels mixed in equal shares (``[1, 2]``: every other row is level 2).  Unused by ``distribution``."""
    train_size: int = 2000
    """Number of generated training prompts."""
    val_size: int = 64
    """Number of generated validation prompts.  ``arithmetic`` draws them from held-out problems that its
    training split never contains."""
    distribution: DistributionTaskConfig = field(default_factory=DistributionTaskConfig)
    """The target distribution of ``builtin:distribution``."""


@dataclass
class CustomClsConfig:
    """A user dataset class loaded from a file."""

    path: str | None = None
    """Python file holding the class; None = rlforge's built-in dataset."""
    name: str | None = None
    """Class name inside ``path``."""


@dataclass
class SamplerConfig:
    """``data.sampler``: verl's curriculum sampler class."""

    class_path: str | None = None
    """File of the class; None = the default sampler."""
    class_name: str | None = None
    """Class name."""


@dataclass
class DatagenConfig:
    """``data.datagen``: verl's dynamic data generator class."""

    path: str | None = None
    """File of the class; None = none."""
    name: str | None = None
    """Class name."""


@dataclass
class DataConfig:
    """Training and validation data."""

    tokenizer: str | None = None
    """Tokenizer name or path; None = the actor model's tokenizer."""
    use_shm: bool = False
    """Copy data to shared memory before loading (accepted; no effect in rlforge)."""
    train_files: Any = "~/data/rlhf/gsm8k/train.parquet"
    """Training file(s): a path or list of paths (parquet/jsonl), or ``builtin:<task>``."""
    val_files: Any = "~/data/rlhf/gsm8k/test.parquet"
    """Validation file(s): a path or list of paths, or ``builtin:<task>``."""
    train_max_samples: int = -1
    """Use only the first this many training rows; -1 = all (verl samples a random subset when shuffling)."""
    val_max_samples: int = -1
    """Use only the first this many validation rows; -1 = all."""
    prompt_key: str = "prompt"
    """Column holding the prompt (chat messages list or string)."""
    reward_fn_key: str = "data_source"
    """Column selecting the reward function per row."""
    max_prompt_length: int = 512
    """Maximum prompt length in tokens; prompts are left-padded to it."""
    max_response_length: int = 512
    """Maximum generated response length in tokens."""
    train_batch_size: int = 1024
    """Prompts per training step (before ``rollout.n`` responses each).  On several ranks either the
    world divides it (each rank takes whole prompts) or the data-parallel size divides it times
    ``rollout.n`` (each rank takes a share of the samples): :mod:`rlforge.config.sharding`."""
    gen_batch_size: int | None = None
    """Prompts drawn per generation batch under DAPO's dynamic sampling (``algorithm.filter_groups.enable``):
    batches of this many prompts are generated and scored until ``train_batch_size`` groups with a non-zero
    reward spread are kept (the first ones, in order; the rest of the last batch is dropped), as verl's DAPO
    recipe does; it is also the training loader's batch size, so an epoch has ``len(data) / gen_batch_size``
    batches.  None = ``train_batch_size``.  Without dynamic sampling each step trains on ``train_batch_size``
    prompts and a different value warns (:func:`generation_batch_size`)."""
    val_batch_size: int | None = None
    """Prompts per validation batch; None = the whole validation set in one batch."""
    tool_config_path: str | None = None
    """Tool config used to count tool tokens in prompt length; None = no tools."""
    return_raw_input_ids: bool = False
    """Also return prompt ids without the chat template (for a reward model with another template)."""
    return_raw_chat: bool = False
    """Also return the prompt messages before the chat template is applied (rlforge always keeps them, as
    ``raw_prompt``; True warns that nothing changes)."""
    return_full_prompt: bool = False
    """Also return the prompt text with the chat template applied."""
    shuffle: bool = True
    """Shuffle the training set each epoch."""
    seed: int | None = 1
    """Seed of the training-set shuffle.  verl's YAML has ``null`` and its sampler then uses 1; None is treated as 1."""
    dataloader_num_workers: int = 8
    """DataLoader worker processes (0 = load in the main process)."""
    validation_shuffle: bool = False
    """Shuffle the validation set (the order of its batches; seeded by ``seed``)."""
    filter_overlong_prompts: bool = False
    """Drop prompts longer than ``max_prompt_length`` tokens at load time."""
    filter_overlong_prompts_workers: int = 1
    """Processes used for that filtering (rlforge filters while tokenizing, in-process; other values warn)."""
    truncation: str = "error"
    """Over-long prompt handling: ``error`` | ``left`` | ``right`` | ``middle``."""
    image_key: str = "images"
    """Column holding images (multi-modal data)."""
    video_key: str = "videos"
    """Column holding videos (multi-modal data)."""
    trust_remote_code: bool = False
    """Allow tokenizer code from the model repository to run."""
    custom_cls: CustomClsConfig = field(default_factory=CustomClsConfig)
    """User dataset class."""
    return_multi_modal_inputs: bool = True
    """Return processed multi-modal inputs with each row."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """verl's curriculum sampler (not loaded: warned); nulls = the default shuffle."""
    datagen: DatagenConfig = field(default_factory=DatagenConfig)
    """verl's dynamic data generator (not available: warned); nulls = none."""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``tokenizer.apply_chat_template``, read by the template as variables
    (Qwen3: ``{enable_thinking: false}``).  Applied to the prompts; multi-turn's inserted turns are rendered
    without them."""
    builtin: BuiltinTaskConfig = field(default_factory=BuiltinTaskConfig)
    """rlforge addition: settings of built-in generated tasks."""


def generation_batch_size(cfg: Any) -> int:
    """Prompts per batch of the training loader: ``data.gen_batch_size`` under dynamic sampling
    (``algorithm.filter_groups.enable``) when set, else ``data.train_batch_size``."""
    gen = cfg.data.gen_batch_size
    if cfg.algorithm.filter_groups.enable and gen is not None:
        return int(gen)
    return int(cfg.data.train_batch_size)
