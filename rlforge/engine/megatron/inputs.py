"""Micro-batch inputs of the ``megatron`` engine, and the model its role functions see.

* :func:`model_inputs`: a micro-batch's ``input_ids``, ``attention_mask`` and ``position_ids`` on
  the device, padded to a common shape: rows by repeating the micro-batch's first row (real
  tokens keep every activation finite; the rows are cut off before the loss), columns on the
  right with masked padding (a multiple of ``tp`` under sequence parallelism).
* :func:`pipeline_micro_batches`: micro-batches of (nearly) equal row counts for the pipeline
  schedules, at least one per pipeline rank (the loss does not depend on the split, see
  :class:`~rlforge.engine.base.LossScale`).
* :func:`align_widths`: the rows of several ranks on common prompt and response widths (each
  rank pads to its own longest response), so they can run together.
* :func:`length_sorted_micro_batches` and :func:`trim_widths`: without a pipeline the micro-batches
  may differ in shape, so rows of similar length go together and each micro-batch is cut to its own
  longest prompt and response: the padded forward then costs about the valid tokens, not
  ``rows x`` the batch's longest sequence.
* :class:`PrecomputedModel`: stands in for the model inside a role's forward or loss function.
  Its call returns the output the stages already computed for that micro-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from rlforge.batch import Batch
from rlforge.engine.megatron.pipeline import MicroInputs


@dataclass
class ModelOutput:
    """The ``.logits`` a role's function reads: ``(rows, seq, V)`` (a vocabulary-sharded DTensor
    under tensor parallelism) or ``(rows, seq, 1)`` values."""

    logits: torch.Tensor


class PrecomputedModel:
    """The model as seen by a role's forward/loss function under ``strategy=megatron``.

    Calling it with the micro-batch's ``input_ids`` (any keywords a HF causal LM takes) returns
    :class:`ModelOutput` with the logits the pipeline computed for that micro-batch.

    Raises:
        RuntimeError: called with other inputs (e.g. a packed, padding-free row).
        AttributeError: asked for anything else of the model (a log Z head's ``forward_with_log_z``,
            the head for fused log-probs), with a message saying so.
    """

    def __init__(self, logits: torch.Tensor, shape: tuple[int, int], config: Any) -> None:
        self._logits = logits
        self._shape = shape
        self.config = config

    def __call__(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> ModelOutput:
        if input_ids is None or tuple(input_ids.shape) != self._shape or kwargs.get("attention_mask", 0) is None:
            got = None if input_ids is None else tuple(input_ids.shape)
            raise RuntimeError(
                f"strategy=megatron runs the model itself and hands the loss the outputs of the padded micro-batch "
                f"{self._shape}; this forward asked for {got} (padding-free packing, "
                "actor_rollout_ref.model.use_remove_padding, is not used with strategy=megatron)"
            )
        return ModelOutput(self._logits)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"strategy=megatron: the loss asked the model for {name!r}; only the logits of the "
                           "micro-batch are available (a policy loss's log Z head and fused heads need strategy=fsdp2)")


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t[:1].expand(rows - t.shape[0], *t.shape[1:])], 0)


def model_inputs(micros: list[Batch], device: torch.device, seq_multiple: int, pad_rows: bool) -> list[MicroInputs]:
    """Device inputs of ``micros``: columns right-padded to a multiple of ``seq_multiple`` and,
    with ``pad_rows``, rows padded to the largest micro-batch."""
    rows = max(len(mb) for mb in micros) if pad_rows else 0
    out = []
    for mb in micros:
        ids, am, pos = (mb[k].to(device) for k in ("input_ids", "attention_mask", "position_ids"))
        extra = -ids.shape[1] % seq_multiple
        if extra:
            step = torch.arange(1, extra + 1, device=device).expand(ids.shape[0], -1)
            ids = torch.cat([ids, ids.new_zeros(ids.shape[0], extra)], 1)
            am = torch.cat([am, am.new_zeros(am.shape[0], extra)], 1)
            pos = torch.cat([pos, pos[:, -1:] + step], 1)
        if pad_rows:
            ids, am, pos = (_pad_rows(t, rows) for t in (ids, am, pos))
        out.append(MicroInputs(ids.contiguous(), am.contiguous(), pos.contiguous()))
    return out


def pipeline_micro_batches(batch: Batch, micro_batch_size: int, max_token_len: int | None, pp: int) -> list[Batch]:
    """Micro-batches for a pipeline schedule, whose micro-batches share one shape.

    The count is the usual one (``ceil(rows / micro_batch_size)``, or the number of token-budget
    micro-batches under dynamic batching, :func:`~rlforge.engine.dynamic_batch.token_budget_partition`),
    raised to at least ``pp`` (at most one per row).  The rows are then dealt, longest first, in
    snake order (1, 2, ..., m, m, ..., 1, ...), so the counts differ by at most one row (little row
    padding) and the valid tokens are balanced.  With the padded forward the compute is ``rows x
    seq`` whatever the split; the budget thus sets how many micro-batches there are.
    """
    lens = [int(x) for x in batch["attention_mask"].sum(-1).tolist()]
    if max_token_len is None:
        m = math.ceil(len(lens) / micro_batch_size)
    else:
        from rlforge.engine.dynamic_batch import token_budget_partition

        m = len(token_budget_partition(lens, max_token_len))
    m = min(max(m, pp), len(lens))
    parts: list[list[int]] = [[] for _ in range(m)]
    for k, i in enumerate(sorted(range(len(lens)), key=lambda i: (-lens[i], i))):
        lap, pos = divmod(k, m)
        parts[pos if lap % 2 == 0 else m - 1 - pos].append(i)
    return [batch.select(sorted(p)) for p in parts]


def _pad_dim1(t: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """Zeros on the left/right of dim 1 (a negative count cuts columns instead)."""
    if not (left or right):
        return t
    return F.pad(t, [0, 0] * (t.ndim - 2) + [left, right])


def align_widths(parts: list[Batch]) -> list[Batch]:
    """``parts`` on one prompt width ``P`` and response width ``R`` (the largest of each): prompts
    and the prompt part of full-sequence tensors are left-padded, responses and response-aligned
    tensors right-padded, with zeros (masked everywhere).  ``responses`` and ``input_ids`` define
    the widths; other 2-D+ tensors must be prompt-, full- or response-wide.

    Raises:
        ValueError: a tensor of another width.
    """
    resp = [int(b["responses"].shape[1]) for b in parts]
    full = [int(b["input_ids"].shape[1]) for b in parts]
    if len(set(resp)) == 1 and len(set(full)) == 1:
        return parts
    big_r, big_p = max(resp), max(f - r for f, r in zip(full, resp, strict=True))
    return [_rewidth(b, f - r, r, big_p - (f - r), big_r - r) for b, r, f in zip(parts, resp, full, strict=True)]


def _rewidth(b: Batch, p: int, r: int, dp: int, dr: int) -> Batch:
    """``b`` (prompt width ``p``, response width ``r``) with ``dp`` columns on the left of the prompt
    and ``dr`` on the right of the response, zeros added when positive, columns cut when negative,
    in every prompt-, full- and response-wide tensor.

    Raises:
        ValueError: a tensor of another width.
    """
    d: dict[str, torch.Tensor] = {}
    for k in b.tensors.keys():
        t = b[k]
        if t.ndim < 2:
            d[k] = t
        elif k == "prompts":
            d[k] = _pad_dim1(t, dp, 0)
        elif t.shape[1] == p + r:
            d[k] = _pad_dim1(t, dp, dr)
        elif t.shape[1] == r:
            d[k] = _pad_dim1(t, 0, dr)
        else:
            raise ValueError(f"cannot change the widths of {k!r}, {t.shape[1]} wide (prompt {p}, response {r})")
    return Batch.from_dict(d, dict(b.non_tensor), dict(b.meta))


def _widths(b: Batch) -> tuple[int, int]:
    """``(prompt width P, response width R)`` of a batch laid out as ``[left-padded prompt | right-padded response]``."""
    r = int(b["responses"].shape[1])
    return int(b["input_ids"].shape[1]) - r, r


def trim_widths(b: Batch) -> Batch:
    """``b`` cut to its own longest prompt and longest response (the inverse of :func:`align_widths`'
    padding): prompt-wide tensors lose left columns, response-wide ones right columns, full-width
    ones both; only padding is removed (the masks say where the tokens are).

    Raises:
        ValueError: a tensor of another width (as :func:`align_widths`).
    """
    p, r = _widths(b)
    am = b["attention_mask"]
    p_keep = int(am[:, :p].sum(1).max()) if p else 0
    r_keep = max(int(am[:, p:].sum(1).max()), 1)
    if (p_keep, r_keep) == (p, r):
        return b
    return _rewidth(b, p, r, p_keep - p, r_keep - r)


def length_sorted_micro_batches(batch: Batch, max_token_len: int, key: str) -> tuple[list[Batch], list[int]]:
    """Token-budget micro-batches for forwards whose shape may change from one micro-batch to the
    next (tensor parallelism without a pipeline): rows sorted longest first, each micro-batch takes
    rows while ``rows x (longest prompt + longest response)`` among them, its padded cost after
    :func:`trim_widths`, stays within ``max_token_len``.

    Returns:
        ``(micro_batches, order)`` as :func:`~rlforge.engine.dynamic_batch.split_by_token_budget`.
    Raises:
        ValueError: a row longer than ``max_token_len`` (naming ``key``), or an empty batch.
    """
    from rlforge.engine.dynamic_batch import _check_budget

    p, _ = _widths(batch)
    am = batch["attention_mask"]
    plen, rlen = am[:, :p].sum(1).tolist(), am[:, p:].sum(1).tolist()
    lens = [a + b for a, b in zip(plen, rlen, strict=True)]
    if not lens:
        raise ValueError("cannot split an empty batch into micro-batches")
    _check_budget(lens, max_token_len, key)
    parts: list[list[int]] = [[]]
    width = (0, 0)
    for i in sorted(range(len(lens)), key=lambda i: (-lens[i], i)):
        grown = (max(width[0], plen[i]), max(width[1], rlen[i]))
        if parts[-1] and (len(parts[-1]) + 1) * sum(grown) > max_token_len:
            parts.append([])
            grown = (plen[i], rlen[i])
        parts[-1].append(i)
        width = grown
    return [batch.select(q) for q in parts], [i for q in parts for i in q]
