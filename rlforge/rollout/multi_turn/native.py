"""The agent loop on the native engine: tool-using conversations decoded as one sequence each.

Every row of the prompt batch is one :class:`~rlforge.rollout.native.sequence.Sequence`.  When a
model turn ends (EOS, or the response budget), :class:`AgentScheduler` *parks* the sequence: it
leaves the running set but keeps its KV blocks.  The turn's tool calls (or the interaction) run on a
worker thread while the other sequences keep decoding.  When they return, the tool-response ids
(rendered by the chat template, :mod:`.render`) are appended to the same sequence and it rejoins
the running set with ``num_computed_tokens`` unchanged, so the next engine step prefills only the
inserted ids (a prefill chunk on top of the cached history) and samples the next model token: the
history is never prefilled again (``reuse_kv=False`` frees the blocks instead, the re-prefill
baseline for ``benchmarks/multi_turn_kv.py``).  A preempted sequence is recomputed as usual.

Token in, token out: the response of a row is exactly its sampled ids and inserted ids in order;
``response_mask`` is 1 on sampled ids and 0 on inserted ones; ``rollout_log_probs`` hold the
sampler's log-probs on sampled ids and 0 elsewhere.  Nothing is re-tokenized from text.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch

from rlforge.batch import Batch
from rlforge.errors import RLForgeError
from rlforge.rollout.base import SamplingParams
from rlforge.rollout.multi_turn.config import MultiTurnConfig
from rlforge.rollout.multi_turn.conversation import Conversation
from rlforge.rollout.multi_turn.executor import SampleTools
from rlforge.rollout.multi_turn.metrics import multi_turn_metrics
from rlforge.rollout.multi_turn.render import TurnRenderer
from rlforge.rollout.native.block_manager import BlockManager
from rlforge.rollout.native.engine import NativeRollout, _elapsed
from rlforge.rollout.native.model_runner import ModelSpec
from rlforge.rollout.native.scheduler import Scheduler, SchedulerOutput
from rlforge.rollout.native.sequence import Sequence, SequenceStatus


class AgentScheduler(Scheduler):
    """:class:`Scheduler` whose sequences end a *turn* instead of finishing: see the module docstring.

    After :meth:`update_burst`, :attr:`turn_ended` holds the sequences whose turn ended this step
    (parked, blocks kept); the caller then calls :meth:`resume` or :meth:`finish` on each.
    """

    def __init__(self, *args: Any, reuse_kv: bool = True, max_tokens_per_turn: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reuse_kv = reuse_kv
        self.max_tokens_per_turn = max_tokens_per_turn or 1 << 62
        self.turn_ended: list[Sequence] = []
        self.masks: dict[int, list[int]] = {}
        self.turn_starts: dict[int, int] = {}

    def extend_for_burst(self, out: SchedulerOutput, max_steps: int) -> int:
        """As :meth:`Scheduler.extend_for_burst`, with no more steps than any sequence's turn has left
        under ``max_tokens_per_turn`` (steps past a turn's end would be thrown away)."""
        left = min(self.turn_starts.get(s.seq_id, 0) + self.max_tokens_per_turn - len(s.output_ids) for s in out.seqs)
        return super().extend_for_burst(out, max(1, min(max_steps, left)))

    def update_burst(self, out: SchedulerOutput, sampled: dict[int, list[int]],
                     log_probs: dict[int, list[float]] | None = None) -> list[Sequence]:
        for seq, n in zip(out.seqs, out.num_new_tokens, strict=True):
            toks = sampled.get(seq.seq_id)
            if toks is None:
                seq.num_computed_tokens += n
                self.block_manager.mark_computed(seq)
                continue
            seq.num_computed_tokens += n + len(toks) - 1
            mask = self.masks[seq.seq_id]
            turn_end = self.turn_starts.get(seq.seq_id, 0) + self.max_tokens_per_turn
            ended = False
            for j, tok in enumerate(toks):
                seq.output_ids.append(tok)
                seq.output_log_probs.append(log_probs[seq.seq_id][j] if log_probs is not None else 0.0)
                mask.append(1)
                if tok in self.eos_ids or len(seq.output_ids) >= min(seq.max_new_tokens, turn_end):
                    ended = True
                    break
            if ended:
                # K/V are valid up to (not including) the last kept token; later burst slots are stale
                seq.num_computed_tokens = min(seq.num_computed_tokens, seq.num_tokens - 1)
                seq.status = SequenceStatus.FINISHED  # parked: out of the running set, blocks kept
                self.running.remove(seq)
                self.turn_ended.append(seq)
            self.block_manager.mark_computed(seq)
        return []

    def resume(self, seq: Sequence, ids: list[int]) -> None:
        """Append inserted ``ids`` to the parked ``seq`` and run it again (its cached K/V kept, or
        freed for a full re-prefill when ``reuse_kv`` is False)."""
        seq.output_ids.extend(ids)
        seq.output_log_probs.extend([0.0] * len(ids))
        self.masks[seq.seq_id].extend([0] * len(ids))
        self.turn_starts[seq.seq_id] = len(seq.output_ids)
        if self.reuse_kv:
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        else:
            self.block_manager.free_seq(seq)
            seq.status = SequenceStatus.WAITING
            self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Free the parked ``seq``'s blocks: its conversation is over."""
        self.block_manager.free_seq(seq)


class MultiTurnNativeRollout(NativeRollout):
    """``rollout.name=native`` with ``multi_turn.enable=true``.

    Args (beyond :class:`NativeRollout`'s, keyword-only):
        tokenizer: the model's tokenizer (turn text for parsing, the chat template for inserted turns).
        multi_turn: the checked :class:`MultiTurnConfig`.
        tools: ``{function name: tool}`` (:func:`rlforge.tools.load_tools`); empty = no tools.
        interactions: ``{name: interaction}`` (:func:`rlforge.interactions.load_interactions`).
        reuse_kv: keep each sequence's KV cache across turns (False: re-prefill the history every turn).
        max_workers: threads running turns' tool calls / interactions at once.
        turn_burst: the agent loop's cap on decode steps between two host reads: its bursts are
            ``min(max_decode_burst, turn_burst)`` steps (16 against the single-turn default of 64).  A turn
            that ends inside a burst is parked, and its tools start, only when the burst ends, so a shorter
            burst starts tools sooner; 16 is the setting ``benchmarks/multi_turn_kv.py`` measured.
            Raises ValueError if below 1.

    The output batch is :class:`~rlforge.rollout.base.Rollout`'s, with ``attention_mask`` 1 on every
    real token (sampled or inserted), ``response_mask`` 1 on sampled tokens only, and per-row non-tensor
    fields ``multi_turn/num_turns``, ``multi_turn/stop_reason``, ``multi_turn/tool_reward`` (the sum of the
    numeric step and ``calc_reward`` rewards), ``multi_turn/interaction_score`` and verl's ``reward_scores``
    (:attr:`Conversation.reward_scores`; the reward manager passes it and the turn count to the reward
    function as ``extra_info["rollout_reward_scores"]`` and ``extra_info["num_turns"]``, as verl does).
    """

    def __init__(self, *args: Any, tokenizer: Any, multi_turn: MultiTurnConfig, tools: dict[str, Any] | None = None,
                 interactions: dict[str, Any] | None = None, reuse_kv: bool = True, max_workers: int = 32,
                 turn_burst: int = 16, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_agent(tokenizer=tokenizer, multi_turn=multi_turn, tools=tools, interactions=interactions,
                         reuse_kv=reuse_kv, max_workers=max_workers, turn_burst=turn_burst)

    @classmethod
    def from_native(cls, native: NativeRollout, **kwargs: Any) -> MultiTurnNativeRollout:
        """The agent loop with every setting of the built ``native`` rollout (``NativeRollout.from_config``),
        plus the keyword arguments of :meth:`__init__` beyond NativeRollout's."""
        obj = cls.__new__(cls)
        obj.__dict__.update(native.__dict__)
        MultiTurnNativeRollout._init_agent(obj, **kwargs)
        return obj

    def _init_agent(self, *, tokenizer: Any, multi_turn: MultiTurnConfig, tools: dict[str, Any] | None = None,
                    interactions: dict[str, Any] | None = None, reuse_kv: bool = True, max_workers: int = 32,
                    turn_burst: int = 16) -> None:
        if turn_burst < 1:
            raise ValueError(f"multi-turn turn_burst must be >= 1, got {turn_burst}")
        self.turn_burst = turn_burst
        self.tokenizer = tokenizer
        self.mt = multi_turn
        self.tools = dict(tools or {})
        self.interactions = dict(interactions or {})
        self.reuse_kv = reuse_kv
        self.max_workers = max_workers
        self.renderer = TurnRenderer(tokenizer, self.eos_ids)

    # ------------------------------------------------------------------ per-sample setup
    def _conversations(self, prompts: Batch) -> list[Conversation]:
        nt = prompts.non_tensor
        rows = len(prompts)
        convs = []
        for i in range(rows):
            extra = nt["extra_info"][i] if "extra_info" in nt and isinstance(nt["extra_info"][i], dict) else {}
            gt = nt["ground_truth"][i] if "ground_truth" in nt else None
            tkw = {k: dict(v or {}) for k, v in dict(extra.get("tools_kwargs") or {}).items()}
            for name in self.tools:
                ck = tkw.setdefault(name, {}).setdefault("create_kwargs", {})
                if gt is not None:
                    ck.setdefault("ground_truth", gt)
            ikw = dict(extra.get("interaction_kwargs") or {})
            interaction = None
            if self.interactions:
                name = ikw.pop("name", None) or next(iter(self.interactions))
                if name not in self.interactions:
                    raise RLForgeError(f"row {i}: extra_info.interaction_kwargs.name={name!r} is not in "
                                       f"{self.mt.interaction_config_path} (has {', '.join(self.interactions)})")
                interaction = self.interactions[name]
                if gt is not None:
                    ikw.setdefault("ground_truth", gt)
            raw = nt["raw_prompt"][i] if "raw_prompt" in nt else None
            msgs = [dict(m) for m in raw] if isinstance(raw, list | tuple | np.ndarray) else []
            convs.append(Conversation(i, self.mt, SampleTools(self.tools, tkw) if self.tools else None, interaction,
                                      ikw, msgs))
        return convs

    def _turn_text(self, seq: Sequence, start: int) -> tuple[str, bool]:
        """The turn's text (without its EOS) and whether the response budget ran out inside it."""
        ids = seq.output_ids[start:]
        ended_eos = bool(ids) and ids[-1] in self._turn_eos
        text = self.tokenizer.decode(ids[:-1] if ended_eos else ids, skip_special_tokens=False)
        return text, not ended_eos and len(seq.output_ids) >= seq.max_new_tokens

    # ------------------------------------------------------------------ the loop
    @torch.no_grad()
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """See the class docstring; shapes as :class:`~rlforge.rollout.base.Rollout`.  Raises ValueError for
        bad prompts, RLForgeError when the KV cache cannot be allocated or a row names an unknown interaction."""
        ids, mask = prompts["input_ids"], prompts["attention_mask"].bool()
        self._check_prompts(ids, mask)
        seqs = [Sequence(i, ids[i][mask[i]].tolist(), params.max_new_tokens) for i in range(len(prompts))]
        convs = self._conversations(prompts)
        spec = ModelSpec.from_module(self.module)
        m: dict[str, float] = {}
        t0 = time.perf_counter()
        pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="rlforge-turn")
        with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None, cache_enabled=False):
            runner, num_blocks = self._wake(seqs, spec)
            bm = BlockManager(num_blocks, self.block_size, self.enable_prefix_caching)
            self._turn_eos = frozenset() if self.ignore_eos else frozenset(self.eos_ids)
            sched = AgentScheduler(self.scheduler_config, bm, self._turn_eos, reuse_kv=self.reuse_kv,
                                   max_tokens_per_turn=self.mt.max_tokens_per_turn)
            for s in seqs:
                sched.masks[s.seq_id] = []
                sched.add(s)
            pending: dict[Future, Sequence] = {}
            tool_wait_s = 0.0
            prefill_tokens = 0  # tokens fed that are not a decode: prompts, inserted turns, recomputed history
            try:
                while sched.has_unfinished or pending:
                    if sched.has_unfinished and (sched.running or sched.waiting and bm.can_allocate(sched.waiting[0])
                                                 or not pending):
                        out = sched.schedule()
                        prefill_tokens += sum(n for q, n in zip(out.seqs, out.num_new_tokens, strict=True)
                                              if not (n == 1 and q.num_computed_tokens + 1 == q.num_tokens
                                                      and sched.masks[q.seq_id][-1:] == [1]))
                        if sched.is_pure_decode(out):
                            k = sched.extend_for_burst(out, min(self.max_decode_burst, self.turn_burst))
                            toks, lps = self._decode_burst(runner, out, k, params)
                        else:
                            toks, lps = self._mixed_step(runner, out, params)
                        sched.update_burst(out, toks, lps if self.calculate_log_probs else None)
                        for seq in sched.turn_ended:
                            c = convs[seq.seq_id]
                            text, hit_length = self._turn_text(seq, c.turn_start)
                            calls = c.end_turn(text, hit_length)
                            if calls is None:
                                sched.finish(seq)
                            else:
                                pending[pool.submit(c.next_messages, calls)] = seq
                        sched.turn_ended.clear()
                        done = [f for f in pending if f.done()]
                    else:
                        tw = time.perf_counter()
                        done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                        tool_wait_s += time.perf_counter() - tw
                    for f in done:
                        self._insert(sched, convs, pending.pop(f), f.result())
            finally:
                for f in pending:
                    f.cancel()
            m["rollout/gen_s"] = _elapsed(t0, self.device)
            m["rollout/tool_wait_s"] = tool_wait_s
            m["rollout/prefill_tokens"] = float(prefill_tokens)
        for f in [pool.submit(c.close) for c in convs]:
            f.result()
        pool.shutdown(wait=False)
        if self.free_cache_engine:
            self._sleep()
        self.last_stats, self.last_num_preemptions = bm.stats, sched.num_preemptions
        out_batch = self._assemble_turns(prompts, seqs, sched.masks, convs)
        sampled = sum(sum(v) for v in sched.masks.values())
        total = sum(len(v) for v in sched.masks.values())
        self._last_metrics = {
            **m,
            "rollout/output_tokens_per_s": sampled / max(m["rollout/gen_s"], 1e-9),
            "rollout/multi_turn_tokens_per_s": total / max(m["rollout/gen_s"], 1e-9),
            "rollout/num_preemptions": float(sched.num_preemptions),
            "rollout/prefix_hit_blocks": float(bm.stats.prefix_hit_blocks),
            **multi_turn_metrics(convs, sched.masks),
        }
        return out_batch

    def _insert(self, sched: AgentScheduler, convs: list[Conversation], seq: Sequence,
                messages: list[dict[str, Any]] | None) -> None:
        """Main thread: render ``messages`` and resume ``seq``, or end it (interaction over, or no room)."""
        c = convs[seq.seq_id]
        if messages is None:
            sched.finish(seq)
            return
        ids = self.renderer.insert_ids(messages)
        if seq.output_ids[-1] not in self._turn_eos:  # the turn hit max_tokens_per_turn: close it with an EOS
            ids = [self.eos_ids[0], *ids]
        if len(seq.output_ids) + len(ids) >= seq.max_new_tokens:  # no room for the inserted turn + a model token
            c.stop_reason = "truncated_at_turn"
            sched.finish(seq)
            return
        c.messages.extend(messages)
        c.user_turns += 1
        c.turn_start = len(seq.output_ids) + len(ids)
        sched.resume(seq, ids)

    def _assemble_turns(self, prompts: Batch, seqs: list[Sequence], masks: dict[int, list[int]],
                        convs: list[Conversation]) -> Batch:
        width = max(1, max(len(s.output_ids) for s in seqs))
        b = len(seqs)
        resp = torch.full((b, width), self.pad_id, dtype=torch.long)
        rmask = torch.zeros((b, width), dtype=torch.long)
        real = torch.zeros((b, width), dtype=torch.long)
        lp = torch.zeros((b, width), dtype=torch.float32)
        for s in seqs:
            n = len(s.output_ids)
            resp[s.seq_id, :n] = torch.tensor(s.output_ids, dtype=torch.long)
            rmask[s.seq_id, :n] = torch.tensor(masks[s.seq_id], dtype=torch.long)
            real[s.seq_id, :n] = 1
            lp[s.seq_id, :n] = torch.tensor(s.output_log_probs, dtype=torch.float32)
        p_ids, p_mask = prompts["input_ids"], prompts["attention_mask"].long()
        attn = torch.cat([p_mask, real], dim=1)
        pos = (torch.cumsum(attn, dim=1) - 1).clamp(min=0)
        nt = dict(prompts.non_tensor.items())
        nt["multi_turn/num_turns"] = np.array([c.num_turns for c in convs], dtype=object)
        nt["multi_turn/stop_reason"] = np.array([c.stop_reason for c in convs], dtype=object)
        nt["multi_turn/tool_reward"] = np.array([c.tool_reward for c in convs], dtype=object)
        nt["multi_turn/interaction_score"] = np.array([c.interaction_score for c in convs], dtype=object)
        nt["reward_scores"] = np.array([c.reward_scores for c in convs], dtype=object)
        tensors = {"prompts": p_ids, "responses": resp, "response_mask": rmask,
                   "input_ids": torch.cat([p_ids, resp], dim=1), "attention_mask": attn, "position_ids": pos}
        if self.calculate_log_probs:
            tensors["rollout_log_probs"] = lp * rmask
        return Batch.from_dict(tensors, nt, dict(prompts.meta))
