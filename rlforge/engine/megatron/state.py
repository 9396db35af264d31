"""The ``megatron`` engine's weights and state: full tensors out of the shards, and back.

A mixin of :class:`~rlforge.engine.megatron.engine.MegatronEngine`; it uses the engine's
``module`` (a ``StagedModel``), ``pm`` (the mesh), ``dims``, ``device``, ``optimizer``,
``scheduler``, ``tied``, ``_names`` / ``_param_names`` (the HF model's state-dict keys and
parameter names, in order), ``_local_params`` (this rank's parameters by HF name) and
``_entries`` (the gather plan of the state dict).  See :mod:`~rlforge.engine.megatron.weights`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from rlforge.engine.activation import clean_name
from rlforge.engine.base import copy_full_params
from rlforge.engine.distributed import get_rank
from rlforge.engine.megatron.weights import gather_entries, load_full, plan_entries


class WeightsAndState:
    """Weight sync to the rollout, gradients for inspection, and full state dicts."""

    module: Any
    pm: Any
    dims: Any
    device: torch.device
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    tied: bool
    _names: list[str]
    _param_names: list[str]
    _local_params: dict[str, nn.Parameter]
    _entries: list[Any]

    def _local_state(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for st in self.module.stages:
            for k, v in st.state_dict().items():
                out.setdefault(clean_name(k), v)
        return out

    def full_params_iter(self, device: torch.device | str | None = None,
                         keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(HF name, full tensor)`` of every state-dict entry, one at a time, on every rank
        (collective; see :mod:`~rlforge.engine.megatron.weights`).  ``keep``: a name filter
        (every entry is still gathered, the collectives being planned for all; None = all)."""
        dest = torch.device(device) if device is not None else self.device
        local = self._local_state()
        for name, t in gather_entries(self._entries, local.__getitem__, self.pm.pp_rank, self.pm.pp_ranks,
                                      self.pm.pp_group, self.device):
            if keep is None or keep(name):
                yield name, t.to(dest)

    def full_grads_iter(self, device: torch.device | str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(HF parameter name, full gradient)`` after :meth:`accumulate_grads`, one at a time, on
        every rank (collective; parameters without a gradient are skipped)."""
        dest = torch.device(device) if device is not None else self.device
        local = {n: p.grad for n, p in self._local_params.items() if p.grad is not None}
        entries = plan_entries(local, self._param_names, self.pm.pp_rank, self.pm.pp_group, self.dims.pp)
        for name, t in gather_entries(entries, local.__getitem__, self.pm.pp_rank, self.pm.pp_ranks,
                                      self.pm.pp_group, self.device):
            yield name, t.to(dest)

    @torch.no_grad()
    def sync_to(self, target: nn.Module) -> None:
        """Copy the full weights into the plain ``target`` (the rollout's copy), tensor by tensor."""
        copy_full_params(self.full_params_iter(), target)

    def state_dict(self) -> dict[str, Any]:
        """Full CPU state in the plain HF module's keys and ``torch.optim``'s integer-keyed
        optimizer format (the fsdp engines load it); tensors on rank 0 only
        (a collective)."""
        keep = get_rank() == 0
        model = {n: t.cpu() for n, t in self.full_params_iter() if keep}
        optim = self._optimizer_state(keep) if self.optimizer is not None else None
        return {"model": model, "optimizer": optim,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def _optimizer_state(self, keep: bool) -> dict[str, Any]:
        assert self.optimizer is not None
        local: dict[str, torch.Tensor] = {}
        for name, p in self._local_params.items():
            for k, v in self.optimizer.state.get(p, {}).items():
                if isinstance(v, torch.Tensor):
                    local[f"{name}\x00{k}"] = v
        order = [f"{n}\x00{k}" for n in self._param_names for k in ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")]
        entries = plan_entries(local, order, self.pm.pp_rank, self.pm.pp_group, self.dims.pp)
        index = {n: i for i, n in enumerate(self._param_names)}
        state: dict[int, dict[str, torch.Tensor]] = defaultdict(dict)
        for key, t in gather_entries(entries, local.__getitem__, self.pm.pp_rank, self.pm.pp_ranks, self.pm.pp_group,
                                     self.device):
            if keep:
                name, k = key.split("\x00")
                state[index[name]][k] = t.cpu()
        hyper = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        return {"state": dict(state), "param_groups": [{**hyper, "params": list(range(len(self._param_names)))}]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a full state (every rank passes the whole dict, e.g. each reads the file)."""
        model = state["model"]
        for name, t in self._local_state().items():
            if name not in model:
                raise KeyError(f"checkpoint has no {name!r}")
            load_full(t, model[name], self.device)
        optim = state.get("optimizer")
        if self.optimizer is not None and optim:
            self._load_optimizer(optim)
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])

    def _load_optimizer(self, optim: dict[str, Any]) -> None:
        assert self.optimizer is not None
        index = {n: i for i, n in enumerate(self._param_names)}
        saved = {int(i): s for i, s in optim["state"].items()}
        for name, p in self._local_params.items():
            src = "model.embed_tokens.weight" if name not in index and self.tied else name
            entry = saved.get(index[src])
            if entry is None:
                continue
            new: dict[str, Any] = {}
            for k, v in entry.items():
                if k == "step" or not isinstance(v, torch.Tensor):
                    new[k] = v.clone() if isinstance(v, torch.Tensor) else v
                else:
                    buf = torch.empty_like(p)
                    load_full(buf, v, self.device)
                    new[k] = buf
            self.optimizer.state[p] = new
        hyper = {k: v for k, v in optim["param_groups"][0].items() if k != "params"}
        for g in self.optimizer.param_groups:
            g.update(hyper)
