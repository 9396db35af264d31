"""Paged KV bookkeeping: fixed-size blocks, a free list, per-sequence block tables, and
prefix sharing by hashing full prompt blocks with reference counts.

A full prompt block gets a chained hash ``hash((prev_hash, tokens))`` when it is allocated.
A later sequence whose leading blocks hash the same shares them (``ref_count`` + 1) and
skips their prefill, once they are *computed* (their K/V written).  Shared blocks are only
read: a sequence never writes into a block it did not allocate, because only full blocks
are shared and a sequence always recomputes at least its last token into its own block.
A block freed to ref 0 keeps its hash (if computed) and is revived on a later hit until the
free list hands it out again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from rlforge.rollout.native.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()
    computed: bool = False


class _Blocks(dict):
    """``block_id -> Block``, each made on first use (a 50k-block cache need not build 50k objects
    before its first step)."""

    def __missing__(self, block_id: int) -> Block:
        b = self[block_id] = Block(block_id)
        return b


@dataclass
class BlockManagerStats:
    """Counters since construction: ``blocks_allocated`` counts fresh blocks taken from the
    free list, ``prefix_hit_blocks`` the blocks shared through the prefix cache."""

    blocks_allocated: int = 0
    prefix_hit_blocks: int = 0
    peak_blocks_in_use: int = 0


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    blocks: dict[int, Block] = field(init=False)
    free: OrderedDict[int, None] = field(init=False)  # insertion-ordered set: LRU-ish reuse
    hash_to_block: dict[int, int] = field(init=False)
    stats: BlockManagerStats = field(init=False)

    def __post_init__(self) -> None:
        self.blocks = _Blocks()
        # OrderedDict, not dict: taking the oldest entry of a plain dict scans past every entry
        # deleted before it (O(blocks taken) per take), an OrderedDict pops it in O(1)
        self.free = OrderedDict.fromkeys(range(self.num_blocks))
        self.hash_to_block = {}
        self.stats = BlockManagerStats()

    # ---------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _prompt_hashes(self, seq: Sequence) -> list[tuple[int, tuple[int, ...]]]:
        """Chained hashes of the full prompt blocks that may be shared: all full blocks that
        end before the sequence's last token (that token is always recomputed)."""
        if not self.enable_prefix_caching:
            return []
        out, prev, bs = [], -1, self.block_size
        n = min(len(seq.prompt_ids), seq.num_tokens - 1) // bs
        for i in range(n):
            toks = tuple(seq.prompt_ids[i * bs:(i + 1) * bs])
            prev = hash((prev, toks))
            out.append((prev, toks))
        return out

    def _lookup(self, h: int, toks: tuple[int, ...]) -> Block | None:
        bid = self.hash_to_block.get(h)
        if bid is None or self.blocks[bid].token_ids != toks:
            return None
        return self.blocks[bid]

    def prefix_pending(self, seq: Sequence) -> bool:
        """True when one of ``seq``'s leading prompt blocks is being prefilled by another
        sequence right now: admit it a step later and share the block instead of recomputing."""
        for h, toks in self._prompt_hashes(seq):
            b = self._lookup(h, toks)
            if b is None:
                return False
            if not b.computed:
                return True
        return False

    def _hits(self, seq: Sequence) -> list[Block]:
        hits = []
        for h, toks in self._prompt_hashes(seq):
            b = self._lookup(h, toks)
            if b is None or not b.computed:
                break
            hits.append(b)
        return hits

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._hits(seq)
        revived = sum(1 for b in hits if b.ref_count == 0)  # hits sitting in the free list
        return self.blocks_for(seq.num_tokens) - len(hits) + revived <= len(self.free)

    # ---------------------------------------------------------------- mutations
    def _take(self, block_id: int | None = None) -> Block:
        if block_id is None:
            block_id, _ = self.free.popitem(last=False)
            b = self.blocks[block_id]
            if b.hash is not None and self.hash_to_block.get(b.hash) == block_id:
                del self.hash_to_block[b.hash]
            b.hash, b.token_ids, b.computed = None, (), False
            self.stats.blocks_allocated += 1
            return b
        del self.free[block_id]
        return self.blocks[block_id]

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` blocks for all its current tokens, sharing cached prompt blocks."""
        assert not seq.block_table, "sequence already holds blocks"
        hashes = self._prompt_hashes(seq)
        hits = self._hits(seq)
        for b in hits:
            if b.ref_count == 0:
                self._take(b.block_id)
            b.ref_count += 1
            seq.block_table.append(b.block_id)
        for i in range(len(hits), self.blocks_for(seq.num_tokens)):
            b = self._take()
            b.ref_count = 1
            if i < len(hashes):
                h, toks = hashes[i]
                if h not in self.hash_to_block:
                    b.hash, b.token_ids = h, toks
                    self.hash_to_block[h] = b.block_id
            seq.block_table.append(b.block_id)
        self.stats.prefix_hit_blocks += len(hits)
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        self._track_peak()

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) - len(seq.block_table) <= len(self.free)

    def append_slots(self, seq: Sequence, num_tokens: int) -> None:
        """Grow ``seq``'s block table to hold ``num_tokens`` tokens."""
        while len(seq.block_table) < self.blocks_for(num_tokens):
            b = self._take()
            b.ref_count = 1
            seq.block_table.append(b.block_id)
        self._track_peak()

    def mark_computed(self, seq: Sequence) -> None:
        """Record that ``seq``'s first ``num_computed_tokens`` K/V are written (only prompt
        blocks can be shared, so only they are marked)."""
        n = min(seq.num_computed_tokens, len(seq.prompt_ids)) // self.block_size
        for i in range(n - 1, -1, -1):  # a sequence's computed blocks are a prefix of its table:
            b = self.blocks[seq.block_table[i]]  # stop at the first one already marked
            if b.computed:
                break
            b.computed = True

    def free_seq(self, seq: Sequence) -> None:
        for bid in reversed(seq.block_table):
            b = self.blocks[bid]
            b.ref_count -= 1
            if b.ref_count == 0:
                if not b.computed and b.hash is not None:
                    if self.hash_to_block.get(b.hash) == bid:
                        del self.hash_to_block[b.hash]
                    b.hash, b.token_ids = None, ()
                self.free[bid] = None
        seq.block_table = []
        seq.num_computed_tokens = 0

    def _track_peak(self) -> None:
        self.stats.peak_blocks_in_use = max(self.stats.peak_blocks_in_use, self.num_used_blocks)
