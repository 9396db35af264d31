"""The paged K/V cache tensors: ``(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)``."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """``data[layer, 0]`` holds keys and ``data[layer, 1]`` values, per block and slot."""

    data: torch.Tensor

    @classmethod
    def allocate(
        cls, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device,
    ) -> KVCache:
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device))

    @property
    def num_blocks(self) -> int:
        return self.data.shape[2]

    @property
    def block_size(self) -> int:
        return self.data.shape[3]

    def flat(self, layer: int, kv: int) -> torch.Tensor:
        """``(num_blocks * block_size, num_kv_heads, head_dim)`` view of one layer's K (0) or V (1)."""
        d = self.data[layer, kv]
        return d.view(-1, d.shape[-2], d.shape[-1])

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return num_layers * 2 * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
