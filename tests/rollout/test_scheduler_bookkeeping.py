"""The native engine's host bookkeeping on hand-computed cases: a burst's tokens are cut after
the first EOS or at the length limit (log-probs cut the same way), finished sequences leave the
running list in one pass without reordering the others, and free KV blocks are taken oldest
first (freed blocks go to the back), as the scheduler and the prefix cache expect; placeholders
of a step not read yet are filled in by ``confirm``, and an EOS there ends the row, preempted or not."""

from __future__ import annotations

from rlforge.rollout.native.block_manager import BlockManager
from rlforge.rollout.native.scheduler import PLACEHOLDER, Scheduler, SchedulerConfig, SchedulerOutput
from rlforge.rollout.native.sequence import Sequence, SequenceStatus

EOS = 2


def _running(prompts: list[list[int]], max_new: list[int]) -> tuple[Scheduler, list[Sequence]]:
    bm = BlockManager(64, 4, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), bm, frozenset({EOS}))
    seqs = [Sequence(i, p, m) for i, (p, m) in enumerate(zip(prompts, max_new, strict=True))]
    for s in seqs:
        sched.add(s)
    out = sched.schedule()  # the whole prompts: every row then samples its first token
    sched.update_burst(out, {s.seq_id: [10 + s.seq_id] for s in seqs}, {s.seq_id: [-0.5] for s in seqs})
    return sched, seqs


def test_burst_is_cut_at_eos_and_at_the_length_limit():
    sched, seqs = _running([[5, 6, 7], [5, 6], [8, 9, 9, 9, 9], [4]], [10, 3, 10, 10])
    out = SchedulerOutput(list(seqs), [1, 1, 1, 1])
    k = sched.extend_for_burst(out, 4)
    assert k == 2  # row 1 may sample only 2 more tokens
    sampled = {0: [30, EOS], 1: [31, 32], 2: [33, 34], 3: [EOS, 35]}
    lps = {i: [-1.0 - i, -2.0 - i] for i in range(4)}
    finished = sched.update_burst(out, sampled, lps)
    assert [s.seq_id for s in finished] == [0, 1, 3]
    assert seqs[0].output_ids == [10, 30, EOS] and seqs[0].output_log_probs == [-0.5, -1.0, -2.0]
    assert seqs[1].output_ids == [11, 31, 32]  # 3 new tokens: the limit
    assert seqs[3].output_ids == [13, EOS] and seqs[3].output_log_probs == [-0.5, -4.0]  # 35 dropped
    assert seqs[2].output_ids == [12, 33, 34] and seqs[2].status is SequenceStatus.RUNNING
    assert sched.running == [seqs[2]]
    assert all(not s.block_table for s in finished)  # their blocks are free again


def test_running_order_is_kept_when_rows_finish():
    sched, seqs = _running([[5, 6]] * 5, [10] * 5)
    out = SchedulerOutput(list(seqs), [1] * 5)
    sched.extend_for_burst(out, 1)
    sched.update_burst(out, {0: [40], 1: [EOS], 2: [41], 3: [EOS], 4: [42]})
    assert [s.seq_id for s in sched.running] == [0, 2, 4]


def test_free_blocks_are_taken_oldest_first():
    bm = BlockManager(6, 4, enable_prefix_caching=False)
    a, b = Sequence(0, [1] * 8, 1), Sequence(1, [1] * 4, 1)
    bm.allocate(a)
    bm.allocate(b)
    assert a.block_table == [0, 1] and b.block_table == [2]
    bm.free_seq(a)  # freed in reverse table order, to the back of the free list
    c = Sequence(2, [1] * 16, 1)
    bm.allocate(c)
    assert c.block_table == [3, 4, 5, 1]
    assert bm.num_free_blocks == 1 and bm.num_used_blocks == 5


def test_placeholders_are_confirmed_and_an_eos_ends_the_row_even_after_preemption():
    """After a mixed step whose tokens are not read yet: rows hold placeholders and the next
    step runs on them; ``confirm`` writes the tokens in, an EOS drops what came after it and
    ends the row, and a row preempted in between leaves the waiting queue instead of being
    prefilled again."""
    bm = BlockManager(64, 4, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64), bm, frozenset({EOS}))
    seqs = [Sequence(i, [5, 6, 7], 10) for i in range(3)]
    for s in seqs:
        sched.add(s)
    out = sched.schedule()
    recs = sched.provisional_update(out, [0, 1, 2], with_log_probs=True)
    assert [s.output_ids for s in seqs] == [[PLACEHOLDER]] * 3 and recs == [(s, 0) for s in seqs]
    nxt = sched.schedule()  # the next step is scheduled on the placeholders: one decode each
    assert nxt.num_new_tokens == [1, 1, 1] and sched.is_pure_decode(nxt)
    recs2 = sched.provisional_update(nxt, [0, 1, 2], with_log_probs=True)
    sched._preempt(seqs[2])  # row 2 loses its blocks before the first step is read
    sched.confirm(recs, [EOS, 11, EOS], [-0.1, -0.2, -0.3])
    assert seqs[0].output_ids == [EOS] and seqs[0].output_log_probs == [-0.1]  # its second placeholder dropped
    assert seqs[0].status is SequenceStatus.FINISHED and not seqs[0].block_table
    assert seqs[1].output_ids == [11, PLACEHOLDER] and seqs[1].status is SequenceStatus.RUNNING
    assert seqs[2].status is SequenceStatus.FINISHED and seqs[2] not in sched.waiting
    assert sched.running == [seqs[1]]
    sched.confirm(recs2, [30, 12, 31], [-1.0, -2.0, -3.0])  # rows 0 and 2 ended: their records are skipped
    assert seqs[1].output_ids == [11, 12] and seqs[1].output_log_probs == [-0.2, -2.0]
    assert seqs[0].output_ids == [EOS] and seqs[2].output_ids == [EOS]
