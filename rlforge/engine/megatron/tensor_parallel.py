"""Tensor parallelism of a :class:`~rlforge.engine.megatron.stage.StageModule` with DTensor.

The plans of torchtitan's ``apply_tp`` (Llama), on the HF module names (Megatron-LM's layout,
Shoeybi et al. 2019, "Megatron-LM", fig. 3; sequence parallelism: Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", section 4.2.2):

==========================================  ==========================================================
module                                      plan
==========================================  ==========================================================
``self_attn.{q,k,v}_proj``                  ``ColwiseParallel``: each rank computes its heads
``self_attn.o_proj``                        ``RowwiseParallel``: partial sums all-reduced (or
                                            reduce-scattered over the sequence with SP)
``mlp.{gate,up}_proj`` / ``mlp.down_proj``  column-wise / row-wise, the same way
``model.embed_tokens``                      ``RowwiseParallel``: vocabulary-parallel embedding
``lm_head``                                 ``ColwiseParallel`` with output ``Shard(-1)``: each rank keeps
                                            its vocabulary slice of the logits (never gathered; see
                                            :mod:`rlforge.algorithms.vocab_parallel`)
with ``sequence_parallel``:
``input_layernorm``, ``post_attention_layernorm``, ``model.norm``   ``SequenceParallel``
``self_attn`` / ``mlp`` inputs              ``PrepareModuleInput``: all-gather the sequence
==========================================  ==========================================================

HF attention reshapes with ``view(*input_shape, -1, head_dim)`` and keeps
``num_key_value_groups = heads / kv_heads``, so the local heads (``heads / tp`` and
``kv_heads / tp``) work unchanged: no attention code is patched.  The value head ``score`` and
every norm without sequence parallelism stay replicated plain parameters (each rank computes
the same values and receives the same gradients).  A tied LM head shares the (sharded)
embedding weight again after sharding.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from rlforge.engine.megatron.stage import StageModule


def layer_plan(sequence_parallel: bool) -> dict[str, object]:
    """The ``parallelize_module`` plan of one decoder layer (HF names)."""
    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, object] = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=seq),
    }
    if sequence_parallel:
        plan.update({
            "input_layernorm": SequenceParallel(),
            "post_attention_layernorm": SequenceParallel(),
            # HF decoder layers call self_attn(hidden_states=...) by keyword and mlp(x) positionally
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        })
    return plan


def apply_tensor_parallel(stage: StageModule, tp_mesh: DeviceMesh, sequence_parallel: bool, tied: bool) -> None:
    """Shard ``stage`` in place over ``tp_mesh`` (a collective over the tensor-parallel group).

    Args:
        stage: an unwrapped stage on its device (checkpoint wrappers and FSDP come after).
        tp_mesh: the 1-D tensor-parallel mesh.
        sequence_parallel: ``megatron.sequence_parallel`` (hidden states between layers are
            then ``(batch, seq / tp, hidden)`` per rank; ``seq`` must divide by ``tp``).
        tied: the model ties ``lm_head.weight`` to the embedding (re-tied after sharding when
            both are in this stage).
    """
    seq = Shard(1) if sequence_parallel else Replicate()
    for layer in stage.model.layers.values():
        parallelize_module(layer, tp_mesh, layer_plan(sequence_parallel))
    top: dict[str, object] = {}
    if stage.is_first:
        top["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if stage.is_last and sequence_parallel:
        top["model.norm"] = SequenceParallel()
    if stage.head_kind == "lm":
        top["lm_head"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=True)
    if top:
        parallelize_module(stage, tp_mesh, top)
    if tied and stage.is_first and stage.head_kind == "lm":
        stage.lm_head.weight = stage.model.embed_tokens.weight
