"""transformers baselines for ``benchmarks/rollout_throughput.py``: a registry of setups.

Every setup samples at T = 1 with no top-k/top-p from random prompts of equal length and
returns ``(generated tokens, seconds, note)``.  The generated tokens are counted per row (up to
and including the first EOS where EOS can end a row), not as ``batch x width``.

``generate`` setups call ``model.generate`` on one left-aligned batch (all prompts have the
same length, so no padding).  The issue-17 call is ``generate``::

    model.generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=True, temperature=1.0,
                   top_k=0, top_p=1.0, pad_token_id=0)

``generate-old`` is the call this benchmark made before (its 14.8k tok/s row): the same plus
``attention_mask=torch.ones_like(ids)`` and ``eos_token_id=None``.  ``generate-mask`` and
``generate-noeos`` add only one of the two, so the table shows which costs the time.
``static-compile`` adds ``cache_implementation="static"`` (transformers then compiles the
forward itself on CUDA).  Each generate row is warmed up untimed by the same call on the same
batch: the whole call where every row has the same length (the random workload); on the long tail
the same call with the same ``max_time`` when one is given (so the timed call runs warm over the
steps it reaches; its tokens/s then covers the call's first, fullest steps and flatters ``generate``
against a whole run), else the call stopped after 8 steps.  The whole-call warm-up matters: in a fresh process the first full-length call at batch
1024 ran at 11.7k tokens/s and the next at 32.7k-41.0k (``hf_baseline_check.py``, 2026-12-01),
because the dynamic cache's growing tensors go to ``cudaMalloc`` until PyTorch's allocator holds
blocks of every size; a generate loop in RL training runs warm.

``cb`` setups use transformers' continuous batching: ``init_continuous_batching`` and its
manager (warm-up untimed, then ``add_request`` per prompt with its own ``max_new_tokens``,
EOS off), falling back to ``model.generate_batch(inputs=list_of_lists,
generation_config=GenerationConfig(...))`` (timed with its own warm-up) where the manager API is
missing.  Arguments are passed only where the installed transformers has them (the device has
5.17, this checkout's venv 5.24).

Long-tail lengths (a per-row ``lengths`` array): continuous batching takes them as per-request
``max_new_tokens``; ``generate`` cannot, so a logits processor forces EOS at each row's length
and forbids it before (``min_new_tokens`` is then dropped: it would forbid that EOS), and the
batch runs until its longest row ends, as ``generate`` does.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import LogitsProcessor, StoppingCriteria

FORCED_EOS = 1  # the long-tail workload's EOS id (prompts use ids >= 100)


class _StopAfter(StoppingCriteria):
    """Stopping criterion: stop every row after ``steps`` new tokens (the warm-up)."""

    def __init__(self, prompt_len: int, steps: int) -> None:
        self.prompt_len, self.steps = prompt_len, steps

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw) -> torch.Tensor:
        done = input_ids.shape[1] - self.prompt_len >= self.steps
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class ForcedLengths(LogitsProcessor):
    """Logits processor: row ``i`` emits EOS as its ``lengths[i]``-th new token and never before."""

    def __init__(self, prompt_len: int, lengths: np.ndarray, eos: int, device: torch.device) -> None:
        self.prompt_len, self.eos = prompt_len, eos
        self.last = torch.as_tensor(np.asarray(lengths) - 1, device=device)  # step index of the EOS

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1] - self.prompt_len
        force = (self.last == t)[:, None]
        eos_col = torch.zeros_like(scores, dtype=torch.bool)
        eos_col[:, self.eos] = True
        scores = scores.masked_fill(~force & eos_col, float("-inf"))  # EOS forbidden before its step
        return scores.masked_fill(force & ~eos_col, float("-inf"))  # and the only choice at it


def count_generated(new: torch.Tensor, eos: list[int]) -> int:
    """Tokens of ``new: [B, W]`` (the columns after the prompt) up to and including each row's first EOS."""
    if not eos:
        return new.numel()
    hit = torch.isin(new, torch.tensor(eos, device=new.device))
    first = torch.where(hit.any(1), hit.float().argmax(1) + 1, torch.full_like(hit[:, 0], new.shape[1], dtype=torch.long))
    return int(first.sum())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _eos_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if int(v) >= 0]


@dataclass(frozen=True)
class HFSetup:
    """One baseline setup: ``kind`` ``generate`` or ``cb``; ``kwargs`` extra to the issue's call
    (``generate``) or fields of ``ContinuousBatchingConfig`` (``cb``); ``mask``: pass an all-ones
    ``attention_mask``; ``drop``: keys removed from the base call."""

    kind: str
    doc: str
    kwargs: dict = field(default_factory=dict)
    mask: bool = False
    drop: tuple[str, ...] = ()


HF_SETUPS: dict[str, HFSetup] = {
    "generate": HFSetup("generate", "issue 17's plain call (no attention_mask, model's EOS, min_new_tokens)"),
    "generate-old": HFSetup("generate", "the benchmark's old call: + attention_mask=ones, eos_token_id=None",
                            {"eos_token_id": None}, mask=True),
    "generate-mask": HFSetup("generate", "plain + attention_mask=ones only", mask=True),
    "generate-noeos": HFSetup("generate", "plain + eos_token_id=None only", {"eos_token_id": None}),
    "static-compile": HFSetup("generate", "plain + cache_implementation='static' (auto-compiled forward)",
                              {"cache_implementation": "static"}),
    "cb": HFSetup("cb", "continuous batching, default ContinuousBatchingConfig"),
    "cb-compile": HFSetup("cb", "continuous batching, default_compile_level=1", {"default_compile_level": 1}),
    "cb-nographs": HFSetup("cb", "continuous batching without CUDA graphs", {"use_cuda_graph": False}),
    "cb-graphs": HFSetup("cb", "continuous batching with CUDA graphs forced on (the default turns them off "
                         "when the attention needs a mask, as sdpa does)", {"use_cuda_graph": True}),
    "cb-graphs-compile": HFSetup("cb", "continuous batching, CUDA graphs on and default_compile_level=1",
                                 {"use_cuda_graph": True, "default_compile_level": 1}),
    "cb-noflash": HFSetup("cb", "continuous batching on the model's own attention (no switch to flash)",
                          {"auto_switch_to_flash": False}),
}


def _generate(model, setup: HFSetup, ids: torch.Tensor, lengths: np.ndarray, fixed: bool,
              max_time: float | None) -> tuple[int, float, str]:
    from transformers import LogitsProcessorList, StoppingCriteriaList

    prompt_len = ids.shape[1]
    n_max = int(lengths.max())
    kw = dict(max_new_tokens=n_max, min_new_tokens=n_max, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
              pad_token_id=0)
    for k in setup.drop:
        kw.pop(k, None)
    kw.update(setup.kwargs)
    note = ""
    if not fixed:  # long tail: forced EOS per row
        if "eos_token_id" in setup.kwargs and setup.kwargs["eos_token_id"] is None:
            raise ValueError("this setup turns EOS off, so generate cannot end rows at their lengths")
        kw.pop("min_new_tokens")
        kw["eos_token_id"] = FORCED_EOS
        kw["logits_processor"] = LogitsProcessorList([ForcedLengths(prompt_len, lengths, FORCED_EOS, ids.device)])
    if setup.mask:
        kw["attention_mask"] = torch.ones_like(ids)
    eos = _eos_list(kw["eos_token_id"]) if "eos_token_id" in kw else _eos_list(model.generation_config.eos_token_id)
    if max_time is not None:
        kw["max_time"] = max_time
    if fixed or max_time is not None:  # warm-up: the whole (or the same time-limited) call, see the docstring
        model.generate(ids, **kw)
    else:
        model.generate(ids, **kw, stopping_criteria=StoppingCriteriaList([_StopAfter(prompt_len, 8)]))
    _sync(ids.device)
    t = time.perf_counter()
    out = model.generate(ids, **kw)
    _sync(ids.device)
    sec = time.perf_counter() - t
    if out.shape[1] - prompt_len < n_max:
        note = f"stopped at max_time after {out.shape[1] - prompt_len} of {n_max} steps"
    return count_generated(out[:, prompt_len:], eos), sec, note


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(
        inspect.signature(cls).parameters)


def _cb_config(setup: HFSetup):
    """``ContinuousBatchingConfig(**setup.kwargs)`` with only the fields this transformers has
    (None where the class does not exist); raises ValueError when a setup's field is missing."""
    try:
        from transformers import ContinuousBatchingConfig
    except ImportError:
        try:
            from transformers.generation.configuration_utils import ContinuousBatchingConfig
        except ImportError:
            if setup.kwargs:
                raise ValueError("this transformers has no ContinuousBatchingConfig") from None
            return None
    have = _fields(ContinuousBatchingConfig)
    missing = set(setup.kwargs) - have
    if missing:
        import transformers

        raise ValueError(f"ContinuousBatchingConfig of transformers {transformers.__version__} has no {sorted(missing)}")
    return ContinuousBatchingConfig(**setup.kwargs)


def _call(fn: Callable, **kw):
    """``fn(**kw)`` with only the keywords ``fn`` accepts (None values dropped)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**{k: v for k, v in kw.items() if v is not None})
    return fn(**{k: v for k, v in kw.items() if k in params and v is not None})


def _continuous(model, setup: HFSetup, prompts: list[list[int]], lengths: np.ndarray,
                timeout_s: float) -> tuple[int, float, str]:
    from transformers import GenerationConfig

    n_max = int(lengths.max())
    gc = GenerationConfig(max_new_tokens=n_max, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          pad_token_id=0, eos_token_id=None)
    cbc = _cb_config(setup)
    if not hasattr(model, "init_continuous_batching"):
        if not np.all(lengths == n_max):
            raise ValueError("no init_continuous_batching: generate_batch cannot take per-request lengths")
        gc.eos_token_id = -1
        _sync(model.device)
        t = time.perf_counter()
        res = _call(model.generate_batch, inputs=prompts, generation_config=gc, continuous_batching_config=cbc,
                    progress_bar=False)
        _sync(model.device)
        sec = time.perf_counter() - t
        return sum(len(r.generated_tokens) for r in res.values()), sec, "generate_batch (its warm-up timed)"
    hints = None
    for mod in ("utils", "continuous_api"):
        try:
            hints_cls = importlib.import_module(f"transformers.generation.continuous_batching.{mod}").WorkloadHints
        except (ImportError, AttributeError):
            continue
        hints = _call(hints_cls, max_prompt_length=max(len(p) for p in prompts), max_generated_length=n_max,
                      num_requests=len(prompts))
        break
    mgr = _call(model.init_continuous_batching, generation_config=gc, continuous_batching_config=cbc,
                workload_hints=hints)
    try:
        if hasattr(mgr, "warmup") and not getattr(mgr, "warmed_up", False):
            mgr.warmup()  # untimed: CUDA-graph capture (generate_batch does it before its loop too)
        mgr.start()
        add_kw = {"eos_token_id": -1} if "eos_token_id" in inspect.signature(mgr.add_request).parameters else {}
        _sync(model.device)
        t = time.perf_counter()
        for i, p in enumerate(prompts):
            mgr.add_request(input_ids=p, request_id=f"r{i}", max_new_tokens=int(lengths[i]), **add_kw)
        tokens, finished, short = 0, 0, 0
        while finished < len(prompts) and time.perf_counter() - t < timeout_s:
            r = mgr.get_result(timeout=1)
            if r is None:
                if not mgr.is_running():
                    break
                continue
            if not callable(getattr(r, "is_finished", None)) or r.is_finished():
                finished += 1
                tokens += len(r.generated_tokens)
                short += len(r.generated_tokens) < int(lengths[int(r.request_id[1:])])
        _sync(model.device)
        sec = time.perf_counter() - t
    finally:
        _call(mgr.stop, block=True, timeout=30)
        if callable(getattr(mgr, "destroy", None)):
            mgr.destroy()
        if hasattr(model, "destroy_cached_continuous_batching_manager"):
            model.destroy_cached_continuous_batching_manager()
    if finished < len(prompts):
        raise RuntimeError(f"continuous batching finished {finished} of {len(prompts)} requests in {sec:.0f} s")
    return tokens, sec, f"{short} requests ended short" if short else ""


def run_setup(model, name: str, ids: torch.Tensor, lengths: np.ndarray, max_time: float | None = None,
              timeout_s: float = 600.0) -> tuple[int, float, str]:
    """Run setup ``name`` of :data:`HF_SETUPS` on prompts ``ids: [B, P]`` (CUDA) with
    ``lengths: [B]`` new tokens per row.  Returns ``(generated tokens, seconds, note)``."""
    setup = HF_SETUPS[name]
    lengths = np.asarray(lengths, dtype=np.int64)
    fixed = bool(np.all(lengths == lengths[0]))
    with torch.no_grad():
        if setup.kind == "generate":
            return _generate(model, setup, ids, lengths, fixed, max_time)
        return _continuous(model, setup, ids.tolist(), lengths, timeout_s)
