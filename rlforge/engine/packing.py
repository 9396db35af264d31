"""Padding-free forward (``actor_rollout_ref.model.use_remove_padding``).

The valid tokens of a padded micro-batch (left-padded prompt + right-padded response,
``(batch, seq)``) are packed into one row ``(1, num_tokens)`` whose ``position_ids`` restart
at 0 for every sequence, so no compute is spent on padding.

How attention stays inside each sequence: the model is called with
``attention_mask=None``, ``use_cache=False`` and the packed ``position_ids``.  transformers
5 (``masking_utils._preprocess_mask_arguments`` -> ``find_packed_sequence_indices``) then
detects the packed format from the position resets and builds a block-diagonal causal mask
(``packed_sequence_mask_function`` AND causal on the per-sequence positions) for the
``sdpa``, ``eager`` and ``flex_attention`` implementations; with ``flash_attention_2/3``
the same ``position_ids`` are turned into ``cu_seqlens`` for the varlen kernel (the fast
path on CUDA).  No model code is patched.  The detection needs each sequence's positions
to be ``0, 1, ..., len - 1``, which :func:`pack` checks.

With ``attn_implementation == "rlforge_varlen"`` (:mod:`rlforge.engine.varlen`, chosen by
default on CUDA) the model also gets the ``cu_seqlens`` offsets and a placeholder 4D mask, so
no ``(N, N)`` mask is built and each sequence attends through ``varlen_attn``.

Outputs follow :mod:`rlforge.roles.forward` exactly (same shapes, dtype, temperature
handling); positions whose response token is padding hold 0 instead of the padded
forward's meaningless values (both are masked by ``response_mask``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from rlforge.algorithms.entropy import entropy_from_logits
from rlforge.algorithms.log_probs import log_probs_from_logits
from rlforge.batch import Batch
from rlforge.engine.varlen import packed_attention_args
from rlforge.roles.fused_head import (
    fsdp2_view_outputs_ok,
    head_log_probs,
    last_hidden_states,
    scatter_flat,
)


@dataclass(frozen=True)
class PackedInputs:
    """One padded micro-batch, packed.

    ``input_ids``, ``position_ids``: ``(1, N)``, ``N = attention_mask.sum()``;
    ``packed_index``: ``(B, T)`` int64, the packed position of each padded position
    (meaningless where ``valid`` is False); ``valid``: ``(B, T)`` bool attention mask;
    ``cu_seqlens``: ``(B + 1,)`` int32 sequence start offsets in the packed row;
    ``max_len``: the longest sequence (a host int; None only where a caller builds one without it);
    ``kv_index``, ``cu_seqlens_k``, ``max_len_k``: the shared-prompt layout's keys (see
    :class:`PackPlan`), None otherwise.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    packed_index: torch.Tensor
    valid: torch.Tensor
    cu_seqlens: torch.Tensor
    max_len: int | None = None
    kv_index: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_len_k: int | None = None


PACK_PLAN = "pack_plan"
"""The ``Batch.meta`` key of a micro-batch's :class:`PackPlan` (dropped by ``Batch.select``)."""

_POSITIONS_MSG = "position_ids of every row must count 0, 1, ... over its attention_mask == 1 tokens"


@dataclass(frozen=True)
class PackPlan:
    """The index work of :func:`pack` and of the response gather, done on the host before the
    micro-batch moves to the device, so that the forward needs no host read of a device value
    (boolean-mask indexing, ``torch.equal`` and ``int(max)`` each wait for every queued kernel,
    and the GPU then idles while the host queues the next ones).

    ``shape``: the micro-batch's ``(B, T)``; ``flat``: ``(N,)`` int64 row-major indices of the
    ``attention_mask == 1`` positions; ``cu_seqlens``: ``(B + 1,)`` int32; ``max_len``: the longest
    row (int); ``packed_index``: ``(B, T)`` int64 as in :class:`PackedInputs`; ``positions_ok``:
    whether every row's positions count ``0..len-1``; ``keep_flat``: ``(K,)`` int64 row-major
    indices into ``(B, R)`` of the response tokens that are real (``None`` without ``responses``);
    ``response_src``: ``(K,)`` int64, their predicting positions in the packed row.

    Shared-prompt layout (``actor.use_prefix_grouper``, :func:`make_pack_plan` with
    ``share_prompts``): rows whose prompt tokens are identical form a group; the packed row holds
    the group's prompt once, then each member's response.  ``cu_seqlens`` / ``max_len`` then bound
    the *query* segments (a group's prompt, then each response); ``kv_index`` ``(Nk,)`` int64 lists
    the packed positions each segment attends to, segment after segment (the prompt: itself; a
    response: the prompt, then itself), with offsets ``cu_seqlens_k`` and longest ``max_len_k``;
    attention is causal with the diagonal at each segment's end (a response's first token sees the
    whole prompt).  ``packed_index`` maps a member's prompt positions to the group's one copy, so
    ``response_src`` (and every gather through ``packed_index``) needs no other change.  Without
    sharing these three fields are None.  ``saved``: ``(tokens, Σ s²)`` that the shared layout does
    not compute against the unshared rows: a group of ``m`` rows with a ``P``-token prompt saves
    ``(m - 1)·P`` tokens and ``(m - 1)·P²`` of :mod:`rlforge.perf.flops`'s attention count (its
    causal work doubled, as that count takes a row's ``s²``: a response's ``R`` queries against
    ``P + R`` keys are ``2RP + R²`` there, shared or not); ``(0, 0)`` without sharing.
    """

    shape: tuple[int, int]
    flat: torch.Tensor
    cu_seqlens: torch.Tensor
    max_len: int
    packed_index: torch.Tensor
    positions_ok: bool
    keep_flat: torch.Tensor | None = None
    response_src: torch.Tensor | None = None
    kv_index: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_len_k: int | None = None
    saved: tuple[int, int] = (0, 0)

    def to_device(self, device: torch.device | str) -> PackPlan:
        """The same plan with its tensors on ``device``."""
        mv = {k: getattr(self, k).to(device) for k in ("flat", "cu_seqlens", "packed_index", "keep_flat",
                                                       "response_src", "kv_index", "cu_seqlens_k")
              if getattr(self, k) is not None}
        return replace(self, **mv)

    @property
    def shared(self) -> bool:
        """Whether the plan is the shared-prompt layout."""
        return self.kv_index is not None


def make_pack_plan(mb: Batch, share_prompts: bool = False) -> PackPlan:
    """The :class:`PackPlan` of a micro-batch with ``attention_mask`` ``(B, T)`` (and optionally
    ``position_ids (B, T)`` and ``responses (B, R)``), computed where its tensors are: on the host
    before staging (no device read later), or on the device as a fallback (then ``nonzero``,
    ``max`` and the position check each read the device once).

    ``share_prompts``: the shared-prompt layout (see :class:`PackPlan`) when the micro-batch has
    ``input_ids``, ``position_ids`` and ``responses`` on the CPU and at least two rows with the same
    prompt; otherwise the plain layout."""
    if share_prompts:
        plan = _shared_plan(mb)
        if plan is not None:
            return plan
    valid = mb["attention_mask"].bool()
    dev = valid.device
    rows, total = valid.shape
    lens = valid.sum(-1)
    flat = valid.reshape(-1).nonzero().squeeze(1)
    cu = torch.zeros(rows + 1, dtype=torch.int32, device=dev)
    cu[1:] = torch.cumsum(lens, 0)
    positions_ok = True  # without position_ids there is nothing to check (and nothing to pack)
    if "position_ids" in mb:
        pos = mb["position_ids"].reshape(-1).index_select(0, flat)
        expected = torch.arange(pos.numel(), device=dev) - torch.repeat_interleave(cu[:-1].long(), lens)
        positions_ok = bool(torch.equal(pos, expected))
    packed_index = (torch.cumsum(valid.reshape(-1).long(), 0) - 1).clamp_min(0).view_as(valid)
    keep_flat = src = None
    if "responses" in mb:
        keep_flat, src = _response_gather_plan(valid, packed_index, mb["responses"].shape[1])
    return PackPlan((rows, total), flat, cu, int(lens.max()) if rows else 0, packed_index, positions_ok,
                    keep_flat, src)


def _response_gather_plan(valid: torch.Tensor, packed_index: torch.Tensor, resp_len: int
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep_flat, response_src)`` of :class:`PackPlan` from the ``(B, T)`` mask and packed index."""
    total = valid.shape[1]
    cols = slice(total - resp_len - 1, total - 1)
    keep = valid[:, cols] & valid[:, total - resp_len:]
    keep_flat = keep.reshape(-1).nonzero().squeeze(1)
    return keep_flat, packed_index[:, cols].reshape(-1).index_select(0, keep_flat)


def prompt_groups(mb: Batch) -> list[list[int]]:
    """The rows of ``mb`` grouped by identical prompt (the ``input_ids`` at ``attention_mask == 1``
    in the columns before ``responses``), each group ascending, groups in first-seen order.
    Needs ``attention_mask``, ``input_ids`` and ``responses``."""
    valid = mb["attention_mask"].bool().cpu()
    width = valid.shape[1] - mb["responses"].shape[1]  # prompt columns (left-padded), then the response
    ids = mb["input_ids"][:, :width].cpu()
    groups: dict[bytes, list[int]] = {}
    for b in range(valid.shape[0]):
        groups.setdefault(ids[b][valid[b, :width]].numpy().tobytes(), []).append(b)
    return list(groups.values())


def _shared_plan(mb: Batch) -> PackPlan | None:
    """The shared-prompt :class:`PackPlan`, or None where it does not apply (no ``responses``,
    ``input_ids`` or ``position_ids``, tensors off the CPU, a row without prompt tokens, or no
    two rows with the same prompt)."""
    if not all(k in mb for k in ("input_ids", "position_ids", "responses")):
        return None
    valid = mb["attention_mask"].bool()
    if valid.device.type != "cpu":
        return None
    rows, total = valid.shape
    resp_len = mb["responses"].shape[1]
    width = total - resp_len  # prompt columns (left-padded), then response columns (right-padded)
    prompt_cols = [valid[b, :width].nonzero().squeeze(1) for b in range(rows)]
    resp_cols = [valid[b, width:].nonzero().squeeze(1) + width for b in range(rows)]
    if any(c.numel() == 0 for c in prompt_cols):
        return None
    groups = prompt_groups(mb)
    if all(len(g) == 1 for g in groups):
        return None
    flat: list[torch.Tensor] = []
    q_lens: list[int] = []
    kv: list[torch.Tensor] = []
    k_lens: list[int] = []
    packed_index = torch.zeros((rows, total), dtype=torch.long)
    n = 0
    for members in groups:
        lead = members[0]
        p = prompt_cols[lead]
        prompt_pos = torch.arange(n, n + p.numel())
        flat.append(lead * total + p)
        q_lens.append(p.numel())
        kv.append(prompt_pos)
        k_lens.append(p.numel())
        n += p.numel()
        for b in members:
            packed_index[b, p] = prompt_pos
            r = resp_cols[b]
            if r.numel() == 0:
                continue
            resp_pos = torch.arange(n, n + r.numel())
            packed_index[b, r] = resp_pos
            flat.append(b * total + r)
            q_lens.append(r.numel())
            kv.append(torch.cat([prompt_pos, resp_pos]))
            k_lens.append(p.numel() + r.numel())
            n += r.numel()
    flat_t = torch.cat(flat)
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    cu_k = torch.zeros(len(k_lens) + 1, dtype=torch.int32)
    cu_k[1:] = torch.cumsum(torch.tensor(k_lens), 0)
    kv_index = torch.cat(kv)
    # each key's position must be its place in its segment: a prompt counts 0..P-1, a response P..P+R-1
    pos = mb["position_ids"].reshape(-1).index_select(0, flat_t)
    key_pos = pos.index_select(0, kv_index)
    expected = torch.arange(kv_index.numel()) - torch.repeat_interleave(cu_k[:-1].long(), torch.tensor(k_lens))
    positions_ok = bool(torch.equal(key_pos, expected))
    keep_flat, src = _response_gather_plan(valid, packed_index, resp_len)
    copies = [(len(members) - 1, prompt_cols[members[0]].numel()) for members in groups]
    saved = (sum(c * p for c, p in copies), sum(c * p * p for c, p in copies))
    return PackPlan((rows, total), flat_t, cu, max(q_lens), packed_index, positions_ok, keep_flat, src,
                    kv_index, cu_k, max(k_lens), saved)


def with_pack_plan(mb: Batch, share_prompts: bool = False) -> Batch:
    """``mb`` with its :class:`PackPlan` in ``meta`` (a shallow copy), when its tensors are on the
    CPU and it has ``attention_mask`` and ``position_ids``; otherwise ``mb`` unchanged.
    ``share_prompts``: see :func:`make_pack_plan`."""
    if "attention_mask" not in mb or "position_ids" not in mb or mb["attention_mask"].device.type != "cpu":
        return mb
    return Batch(mb.tensors, mb.non_tensor, {**mb.meta, PACK_PLAN: make_pack_plan(mb, share_prompts)})


def plan_of(mb: Batch) -> PackPlan | None:
    """The micro-batch's :class:`PackPlan` if it has one for its current shape and device."""
    plan = mb.meta.get(PACK_PLAN)
    am = mb["attention_mask"]
    if isinstance(plan, PackPlan) and plan.shape == tuple(am.shape) and plan.flat.device == am.device:
        return plan
    return None


def plan_or_make(mb: Batch) -> PackPlan:
    """:func:`plan_of` ``mb``, or a plan made now where its tensors are (:func:`make_pack_plan`)."""
    return plan_of(mb) or make_pack_plan(mb)


def pack(mb: Batch) -> PackedInputs:
    """Pack ``input_ids`` / ``position_ids`` ``(B, T)`` at ``attention_mask == 1`` into one row,
    with the micro-batch's :class:`PackPlan` (made now when it has none, see :func:`plan_or_make`).

    Raises:
        ValueError: if a row's valid positions are not ``0..len-1`` (packing could not be
            detected from the position resets, and the padded forward would differ).
    """
    plan = plan_or_make(mb)
    if not plan.positions_ok:
        raise ValueError(_POSITIONS_MSG)
    ids = mb["input_ids"].reshape(-1).index_select(0, plan.flat).unsqueeze(0)
    pos = mb["position_ids"].reshape(-1).index_select(0, plan.flat).unsqueeze(0)
    return PackedInputs(ids, pos, plan.packed_index, mb["attention_mask"].bool(), plan.cu_seqlens, plan.max_len,
                        plan.kv_index, plan.cu_seqlens_k, plan.max_len_k)


def _packed_forward(module: torch.nn.Module, packed: PackedInputs) -> torch.Tensor:
    """The model's ``logits`` ``(1, N, out)`` on the packed row (attention mask left None so
    that transformers derives the block-diagonal mask from ``position_ids``, or the varlen
    arguments of :func:`~rlforge.engine.varlen.packed_attention_args`)."""
    mask, attn_kwargs = packed_attention_args(module, packed.cu_seqlens, packed.max_len, packed.kv_index,
                                                  packed.cu_seqlens_k, packed.max_len_k)
    with fsdp2_view_outputs_ok():
        out = module(
            input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids, use_cache=False,
            **attn_kwargs,
        )
    return out.logits


def _response_gather(packed: PackedInputs, mb: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed positions ``(B, R)`` whose outputs predict the response tokens (padded columns
    ``P - 1 ... P + R - 2``), and the ``(B, R)`` bool mask of response tokens that are real."""
    resp_len = mb["responses"].shape[1]
    total = packed.valid.shape[1]
    cols = slice(total - resp_len - 1, total - 1)
    index = packed.packed_index[:, cols]
    keep = packed.valid[:, cols] & packed.valid[:, total - resp_len:]
    return index, keep


def packed_response_log_probs(
    module: torch.nn.Module, mb: Batch, temperature: float, with_entropy: bool, chunk_size: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As :func:`rlforge.roles.forward.response_log_probs`, padding-free.

    ``chunk_size > 0``: the model runs without its head and only the packed positions that
    predict real response tokens go through the chunked head (:mod:`rlforge.roles.fused_head`).

    Returns:
        log-probs ``(B, R)`` float32 nats under ``softmax(logits / temperature)`` and, with
        ``with_entropy``, the entropy ``(B, R)`` float32 of that distribution; 0 where the
        response token is padding.
    """
    packed = pack(mb)
    if chunk_size > 0:
        mask, attn_kwargs = packed_attention_args(module, packed.cu_seqlens, packed.max_len, packed.kv_index,
                                                  packed.cu_seqlens_k, packed.max_len_k)
        hidden = last_hidden_states(module, packed.input_ids, mask, packed.position_ids, **attn_kwargs)[0]  # (N, hidden)
        plan = plan_or_make(mb)
        assert plan.response_src is not None and plan.keep_flat is not None  # mb has responses
        targets = mb["responses"].reshape(-1).index_select(0, plan.keep_flat)
        logp, ent = head_log_probs(module, hidden.index_select(0, plan.response_src), targets, temperature,
                                   with_entropy, chunk_size)
        shape = mb["responses"].shape
        return (scatter_flat(plan.keep_flat, logp, shape),
                scatter_flat(plan.keep_flat, ent, shape) if ent is not None else None)
    logits = _packed_forward(module, packed)[0].float()  # (N, V)
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    index, keep = _response_gather(packed, mb)
    sel = logits[index]  # (B, R, V): only the positions that predict response tokens
    logp = log_probs_from_logits(sel, mb["responses"])
    logp = torch.where(keep, logp, torch.zeros_like(logp))
    ent = None
    if with_entropy:
        ent = entropy_from_logits(sel)
        ent = torch.where(keep, ent, torch.zeros_like(ent))
    return logp, ent


def packed_response_values(module: torch.nn.Module, mb: Batch) -> torch.Tensor:
    """As :func:`rlforge.roles.forward.response_values`, padding-free: critic values
    ``(B, R)`` float32 from a value model whose ``logits`` are ``(1, N, 1)``; 0 where the
    response token is padding."""
    packed = pack(mb)
    values = _packed_forward(module, packed)[0, :, 0].float()  # (N,)
    index, keep = _response_gather(packed, mb)
    v = values[index]
    return torch.where(keep, v, torch.zeros_like(v))
