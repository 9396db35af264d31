"""Partial rollout on the GPUs that train (``async_training.partial_rollout``, :mod:`rlforge.config.async_training`).

Each step keeps a pool of prompt groups (``rollout.n`` responses each):

1. **over-provision**: the pool is topped up from the prompt loader (whole loader batches) until it
   holds ``data.train_batch_size`` + ``ceil(staleness_threshold x train_batch_size)`` groups;
2. **generate** every unfinished response of the pool in one native-engine call
   (:class:`~rlforge.rollout.native.resume.Resume`): a response carried over from an earlier step
   continues from its exact tokens (re-prefilled; KV blocks are not kept) under the current weights;
3. **stop early**: the call ends as soon as ``train_batch_size`` groups have all ``n`` responses
   ended (checked between engine steps, so at most one decode burst late); the step trains on the first
   ``train_batch_size`` groups to finish (whole groups only), the rest stay in the pool.

Every response token records the policy version that sampled it (``rollout_param_versions``,
``(batch, response_len)`` int64: the number of actor updates before it was sampled) and its rollout
log-prob (``rollout_log_probs``, where ``rollout.calculate_log_probs``), which
``algorithm.rollout_correction`` compares with the trainer's.  With ``max_version_gap`` K, tokens more
than K versions older than the policy being trained are stale: ``stale_mode=mask`` takes them out of
``response_mask`` (the unmasked one kept as ``rollout_response_mask`` for the length metrics);
``drop`` restarts a response holding one from its prompt before the step generates.

Checkpoints save the pool exactly (prompts, tokens, log-probs, versions; :meth:`state_dict`), so a
resumed run continues the same responses; the loader's position already counts the pooled prompts,
so no prompt is lost or trained twice in an epoch.  One process only (``trainer.n_gpus_per_node=1``).

Metrics: verl's ``fully_async/partial/{total_partial_num, partial_ratio, max_partial_span}`` (trained
responses sampled under more than one version; their share; the largest version span of one) and
``fully_async/staleness/{off_policy_token_frac, max_version_gap, stale_token_frac, gap_<k>}`` (token
shares, ``gap_<k>`` the histogram of version gaps, ``k`` up to 3 then ``gap_4+``), ``fully_async/pool_groups``
and ``fully_async/carried_responses``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.config.async_training import extra_groups
from rlforge.errors import ConfigError
from rlforge.rollout.base import SamplingParams, assemble


@dataclass
class Response:
    """One response so far: tokens, their rollout log-probs (nats) and policy versions; ``done`` once ended."""

    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    done: bool = False


@dataclass
class Group:
    """One prompt (unpadded ids, its loader fields, its ``uid``) and its ``n`` responses."""

    prompt_ids: list[int]
    fields: dict[str, Any]
    responses: list[Response]
    finished_at: int = -1  # engine step of the current call that ended it (0: done before the call; -1: open)

    @property
    def done(self) -> bool:
        return all(r.done for r in self.responses)


def _left_padded(prompts: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask``, ``position_ids`` ``(rows, longest)`` as the loader collates them."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def _right_padded(rows: list[list[Any]], pad: Any, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), max(1, max(len(r) for r in rows))), pad, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


class PartialRollout:
    """The pool and its step (module docstring).  Build with :meth:`from_config`."""

    def __init__(self, rollout: Any, loader: Any, n: int, want: int, extra: int, max_gap: int | None,
                 stale_mode: str) -> None:
        self.rollout, self.loader, self.n, self.want, self.extra = rollout, loader, n, want, extra
        self.max_gap, self.stale_mode = max_gap, stale_mode
        self.pool: list[Group] = []

    @classmethod
    def from_config(cls, cfg: Any, rollout: Any, loader: Any, world_size: int, adv_fn: Any) -> PartialRollout | None:
        """None without ``async_training.partial_rollout`` (every key of the section is read either way).
        Raises ConfigError for a rollout that cannot resume (not the single-turn native engine), several
        ranks, or an estimator that needs a greedy baseline rollout."""
        at = cfg.async_training
        on, extra = bool(at.partial_rollout), extra_groups(cfg)
        max_gap, mode = at.max_version_gap, str(at.stale_mode)
        if not on:
            return None
        from rlforge.rollout.native import NativeRollout

        if type(rollout) is not NativeRollout:
            raise ConfigError(f"async_training.partial_rollout=true needs the single-turn native rollout; this job's "
                              f"rollout is {type(rollout).__name__} (actor_rollout_ref.rollout.name)")
        if world_size > 1:
            raise ConfigError(f"async_training.partial_rollout=true runs in one process; this run has {world_size} "
                              "ranks (trainer.n_gpus_per_node / nnodes)")
        if getattr(adv_fn, "needs_reward_baselines", False):
            raise ConfigError(f"async_training.partial_rollout=true does not run with algorithm.adv_estimator="
                              f"{cfg.algorithm.adv_estimator} (its greedy baseline rollout)")
        return cls(rollout, loader, int(cfg.actor_rollout_ref.rollout.n), int(cfg.data.train_batch_size), extra,
                   None if max_gap is None else int(max_gap), mode)

    # ------------------------------------------------------------------ the step
    def _top_up(self) -> None:
        """Queue whole loader batches until the pool holds ``want + extra`` groups."""
        while len(self.pool) < self.want + self.extra:
            b = self.loader.next_batch()
            ids, mask = b["input_ids"], b["attention_mask"].bool()
            for i in range(len(b)):
                fields = {k: v[i] for k, v in b.non_tensor.items()}
                fields["uid"] = str(uuid.uuid4())
                self.pool.append(Group(ids[i][mask[i]].tolist(), fields, [Response() for _ in range(self.n)]))

    def _stale(self, versions: list[int], version: int) -> bool:
        return self.max_gap is not None and bool(versions) and version - min(versions) > self.max_gap

    def _drop_stale(self, version: int) -> int:
        """``stale_mode=drop``: restart each response holding a token that is stale at ``version``."""
        if self.stale_mode != "drop" or self.max_gap is None:
            return 0
        dropped = 0
        for g in self.pool:
            for j, r in enumerate(g.responses):
                if self._stale(r.versions, version):
                    g.responses[j], dropped = Response(), dropped + 1
        return dropped

    def _generate(self, version: int, params: SamplingParams) -> None:
        """One engine call over the unfinished responses; stops once ``want`` groups are done."""
        for g in self.pool:
            g.finished_at = 0 if g.done else -1  # done before this call: first in line
        rows = [(g, j) for g in self.pool for j, r in enumerate(g.responses) if not r.done]
        if not rows or sum(g.done for g in self.pool) >= self.want:
            return
        from rlforge.rollout.native.resume import Resume

        prompts = Batch.from_dict(
            _left_padded([g.prompt_ids for g, _ in rows], int(self.loader.pad_token_id)),
            {**{k: [g.fields[k] for g, _ in rows] for k in rows[0][0].fields},
             "sample_index": [j for _, j in rows]})
        group_of = [id(g) for g, _ in rows]
        tick = [0]

        def stop(seqs: list[Any]) -> bool:  # before each engine step: mark the groups that ended
            tick[0] += 1
            open_groups = {gid for gid, s in zip(group_of, seqs, strict=True) if not s.is_finished}
            for g in self.pool:
                if g.finished_at < 0 and id(g) not in open_groups:
                    g.finished_at = tick[0]
            return sum(g.finished_at >= 0 for g in self.pool) >= self.want

        self.rollout.generate(prompts, params, Resume([list(g.responses[j].tokens) for g, j in rows],
                                                      [list(g.responses[j].log_probs) for g, j in rows], stop))
        for (g, j), s in zip(rows, self.rollout.last_sequences, strict=True):
            r = g.responses[j]
            new = len(s.output_ids) - len(r.tokens)
            r.tokens, r.log_probs = list(s.output_ids), list(s.output_log_probs)
            r.versions = r.versions + [version] * new
            r.done = s.is_finished
        for g in self.pool:  # ended in the engine's last step (after the last stop check)
            if g.done and g.finished_at < 0:
                g.finished_at = tick[0] + 1

    def collect(self, version: int, params: SamplingParams, m: dict[str, float]) -> Batch:
        """The step's batch: ``want`` whole groups (``want x n`` rows, group by group), generated under
        policy ``version`` where not carried over, with ``rollout_param_versions``; metrics into ``m``."""
        self._top_up()
        dropped = self._drop_stale(version)
        self._generate(version, params)
        done = sorted((g for g in self.pool if g.done), key=lambda g: g.finished_at)[: self.want]
        if len(done) < self.want:
            raise RuntimeError(f"internal: partial rollout finished {len(done)} of {self.want} groups")
        chosen = {id(g) for g in done}
        order = [g for g in self.pool if id(g) in chosen]  # pool order: oldest prompts first
        self.pool = [g for g in self.pool if id(g) not in chosen]
        batch = self._assemble(order, version)
        m.update(staleness_metrics(batch["rollout_param_versions"], batch["rollout_response_mask"]
                                   if "rollout_response_mask" in batch else batch["response_mask"], version,
                                   self.max_gap))
        m["fully_async/pool_groups"] = float(len(self.pool))
        m["fully_async/carried_responses"] = float(sum(bool(r.tokens) and not r.done
                                                       for g in self.pool for r in g.responses))
        m["fully_async/dropped_stale_responses"] = float(dropped)
        return batch

    def _assemble(self, groups: list[Group], version: int) -> Batch:
        """The rollout output batch (:mod:`rlforge.rollout.base`) of ``groups``' responses, plus versions."""
        eng, rows = self.rollout, [(g, r) for g in groups for r in g.responses]
        prompts = Batch.from_dict(_left_padded([g.prompt_ids for g, _ in rows], int(self.loader.pad_token_id)),
                                  {k: [g.fields[k] for g, _ in rows] for k in groups[0].fields})
        resp = _right_padded([r.tokens for _, r in rows], eng.pad_id, torch.long)
        out = assemble(prompts, resp, [] if eng.ignore_eos else eng.eos_ids, eng.pad_id)
        mask = out["response_mask"]
        if eng.calculate_log_probs:
            out["rollout_log_probs"] = _right_padded([r.log_probs for _, r in rows], 0.0, torch.float32) * mask
        versions = _right_padded([r.versions for _, r in rows], version, torch.long)
        out["rollout_param_versions"] = versions
        if self.max_gap is not None and self.stale_mode == "mask":
            fresh = (version - versions <= self.max_gap).long()
            if bool((mask * (1 - fresh)).any()):
                out["rollout_response_mask"] = mask
                out["response_mask"] = mask * fresh
        return out

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The pool, exactly (plain Python lists and dicts)."""
        return {"pool": [{"prompt_ids": g.prompt_ids, "fields": dict(g.fields),
                          "responses": [vars(r).copy() for r in g.responses]} for g in self.pool]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool = [Group(list(g["prompt_ids"]), dict(g["fields"]), [Response(**r) for r in g["responses"]])
                     for g in state["pool"]]


def staleness_metrics(versions: torch.Tensor, mask: torch.Tensor, version: int,
                      max_gap: int | None) -> dict[str, float]:
    """Version-gap metrics of the trained tokens (module docstring).  ``versions``, ``mask``:
    ``(batch, response_len)``; ``version``: the policy being trained."""
    valid = mask.bool()
    gap = (version - versions)[valid]
    tokens = max(int(gap.numel()), 1)
    big = torch.iinfo(torch.long).max
    lo = torch.where(valid, versions, torch.full_like(versions, big)).min(1).values
    hi = torch.where(valid, versions, torch.full_like(versions, -big)).max(1).values
    span = (hi - lo).clamp(min=0)[valid.any(1)]
    m = {
        "fully_async/partial/total_partial_num": float((span > 0).sum()),
        "fully_async/partial/partial_ratio": float((span > 0).float().mean()) if span.numel() else 0.0,
        "fully_async/partial/max_partial_span": float(span.max()) if span.numel() else 0.0,
        "fully_async/staleness/off_policy_token_frac": float((gap > 0).sum()) / tokens,
        "fully_async/staleness/max_version_gap": float(gap.max()) if gap.numel() else 0.0,
        "fully_async/staleness/stale_token_frac": float((gap > max_gap).sum()) / tokens if max_gap is not None else 0.0,
    }
    for k in range(4):
        m[f"fully_async/staleness/gap_{k}"] = float((gap == k).sum()) / tokens
    m["fully_async/staleness/gap_4+"] = float((gap >= 4).sum()) / tokens
    return m


def pool_prompt_indices(pool: PartialRollout) -> list[Any]:
    """The dataset ``index`` of each pooled prompt (tests: nothing lost, nothing twice)."""
    return [g.fields.get("index") for g in pool.pool]



