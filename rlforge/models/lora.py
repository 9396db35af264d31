"""LoRA on the actor and the critic (verl's ``model.lora_rank`` keys), built on peft.

peft's ``inject_adapter_in_model`` replaces each targeted ``nn.Linear`` in place by a
``peft.tuners.lora.Linear`` (the original layer becomes its ``base_layer``; ``lora_A``/``lora_B``
hold the adapter) and freezes every other parameter.  The model keeps its own class (no
``PeftModel`` wrapper), so the engines, the decoder-layer lookup, the packed forward and the
chunked LM head see the module they always see; parameter names gain ``.base_layer`` and
``.lora_{A,B}.default`` infixes.  Only parameters with ``requires_grad`` reach the optimizer
(``build_param_groups``), i.e. the adapter (and the critic's value head).

* The reference policy is the same module with every adapter switched off
  (:func:`adapter_disabled`): ``y = base_layer(x)`` exactly, with no second weight copy.
* The rollout keeps its own plain copy of the base model; :func:`merged_params` turns the
  engine's full tensors into that copy's names with ``W + scaling * B @ A`` (float32, then the
  copy's dtype) for every adapted linear layer, and only those are refreshed after an update.
* Checkpoints hold the trainable parameters only; :func:`write_adapter_folder` writes a peft
  adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) that
  ``peft.PeftModel.from_pretrained(base, folder)`` loads.

Errors are :class:`~rlforge.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlforge.config.lora import plain_list
from rlforge.errors import ConfigError

ADAPTER = "default"
"""peft's adapter name; it appears in parameter names (``lora_A.default.weight``)."""
_LORA_PARTS = (f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight")
_BASE = ".base_layer."
def _linear_names(module: nn.Module) -> list[str]:
    """Full names of the ``nn.Linear`` layers of ``module``."""
    return [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]


def _matches(entry: str, names: list[str]) -> bool:
    """peft's rule for a list entry: the full name equals it or ends with ``.<entry>``."""
    return any(n == entry or n.endswith(f".{entry}") for n in names)


def _check_targets(value: Any, module: nn.Module, key: str) -> None:
    """Every entry of a ``target_modules``/``exclude_modules`` list must match a module.

    Raises:
        ConfigError: listing the entries that match nothing and the linear layers' names.
    """
    names = [n for n, _ in module.named_modules() if n]
    if isinstance(value, str):
        if value == "all-linear" or any(re.fullmatch(value, n) for n in names):
            return
        missing = [value]
    else:
        missing = [e for e in value if not _matches(str(e), names)]
        if not missing:
            return
    leaves = sorted({n.rsplit(".", 1)[-1] for n in _linear_names(module)})
    raise ConfigError(f"{key}: {missing} match no module of {type(module).__name__}; its linear layers are "
                      f"named {leaves} (as list entries) or e.g. {_linear_names(module)[0]!r} (full names)")


@dataclass
class LoraPlan:
    """The adapter of one role once applied.

    Attributes:
        config: the ``peft.LoraConfig`` (written as ``adapter_config.json``).
        scaling: ``{adapted linear layer's full name: alpha / r}`` (names of the plain model).
        base_model: the model path the role was built from (recorded in exported folders).
    """

    config: Any
    scaling: dict[str, float] = field(default_factory=dict)
    base_model: str = ""

    def state(self) -> dict[str, Any]:
        """A picklable description saved beside the adapter in checkpoints (see :func:`plan_from_state`)."""
        return {"config": self.config.to_dict(), "scaling": dict(self.scaling), "base_model": self.base_model}


def plan_from_state(state: dict[str, Any]) -> LoraPlan:
    """The inverse of :meth:`LoraPlan.state`."""
    from peft import LoraConfig

    cfg = {k: v for k, v in state["config"].items() if k in LoraConfig.__dataclass_fields__}
    cfg["target_modules"] = plain_list(cfg.get("target_modules"))
    return LoraPlan(LoraConfig(**cfg), dict(state["scaling"]), state.get("base_model", ""))


def _read_adapter_config(path: str, key: str) -> Any:
    from peft import LoraConfig

    folder = Path(path).expanduser()
    if not folder.exists():
        raise ConfigError(f"{key}={path}: no such folder (expected a peft LoRA adapter folder)")
    if not (folder / "adapter_config.json").is_file():
        raise ConfigError(f"{key}={path}: no adapter_config.json there (expected a peft LoRA adapter folder)")
    try:
        return LoraConfig.from_pretrained(str(folder))
    except (ValueError, TypeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{key}={path}: cannot read adapter_config.json ({e})") from None


def apply_lora(module: nn.Module, model_cfg: Any, node: str, base_model: str,
               trainable: tuple[str, ...] = (), seed: int = 0) -> LoraPlan:
    """Inject a LoRA adapter into ``module`` in place (see the module docstring).

    Args:
        module: the plain HF model (float32, not yet wrapped by an engine).
        model_cfg: the role's model block (``lora_rank``, ``lora_alpha``, ``target_modules``,
            ``exclude_modules``, ``lora_adapter_path``).
        node: that block's config key, named in errors (``actor_rollout_ref.model``).
        base_model: the model path, named in errors and written into exported adapters.
        trainable: names of child modules trained whole beside the adapter (the critic's
            ``score`` head); they are never adapted.
        seed: seeds peft's initialisation of ``lora_A`` (``B`` starts at zero), so every rank
            and every rebuild gets the same adapter.
    Returns:
        the :class:`LoraPlan`.
    Raises:
        ConfigError: a target that matches no module (listing the existing names), a target
            that is not a linear layer or is the LM head, an adapter folder that does not fit
            ``module`` (naming both models).
    """
    from peft import LoraConfig, inject_adapter_in_model

    path = getattr(model_cfg, "lora_adapter_path", None)
    if path:
        config = _read_adapter_config(path, f"{node}.lora_adapter_path")
        config.inference_mode = False
    else:
        targets = plain_list(model_cfg.target_modules)
        exclude = plain_list(getattr(model_cfg, "exclude_modules", None))
        _check_targets(targets, module, f"{node}.target_modules")
        if exclude is not None:
            _check_targets(exclude, module, f"{node}.exclude_modules")
        if trainable:
            exclude = [*(exclude or []), *trainable] if not isinstance(exclude, str) else exclude
        config = LoraConfig(r=int(model_cfg.lora_rank), lora_alpha=int(model_cfg.lora_alpha),
                            target_modules=targets, exclude_modules=exclude, lora_dropout=0.0, bias="none")
    adapter_base = config.base_model_name_or_path  # what an adapter folder says it was trained on
    config.base_model_name_or_path = base_model
    head = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            inject_adapter_in_model(config, module, adapter_name=ADAPTER)
    except ValueError as e:  # peft: no target matched (e.g. a regex, or an adapter of another model)
        raise ConfigError(f"{node}: {str(e).splitlines()[0]} (model {base_model})") from None
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    scaling: dict[str, float] = {}
    for name, m in module.named_modules():
        if isinstance(m, LoraLayer):
            if not isinstance(m, LoraLinear) or m.base_layer is head:
                what = "the LM head" if m.base_layer is head else f"a {type(m.base_layer).__name__}"
                raise ConfigError(f"{node}.target_modules: {name} is {what}; LoRA is built for the linear layers "
                                  "inside the decoder (e.g. all-linear)")
            scaling[name] = float(m.scaling[ADAPTER])
    for name in trainable:
        module.get_submodule(name).requires_grad_(True)
    plan = LoraPlan(config, scaling, base_model)
    if path:
        load_adapter_weights(module, path, f"{node}.lora_adapter_path", base_model, adapter_base)
    return plan


def load_adapter_weights(module: nn.Module, path: str, key: str, base_model: str, adapter_base: str | None) -> None:
    """Copy the adapter tensors of the peft folder ``path`` (trained on ``adapter_base``, as its
    ``adapter_config.json`` says) into the injected ``module``, built from ``base_model``.

    Raises:
        ConfigError: a tensor missing, extra or of another shape: the adapter was trained on
            another base model (the message names the adapter's base and ``base_model``).
    """
    folder = Path(path).expanduser()
    st, binf = folder / "adapter_model.safetensors", folder / "adapter_model.bin"
    if st.is_file():
        from safetensors.torch import load_file

        saved = load_file(str(st))
    elif binf.is_file():
        saved = torch.load(binf, map_location="cpu", weights_only=True)
    else:
        raise ConfigError(f"{key}={path}: no adapter_model.safetensors (or .bin) there")
    want = {k: v for k, v in module.state_dict().items() if any(k.endswith(p) for p in _LORA_PARTS)}
    got = {_from_peft_key(k): v for k, v in saved.items()}
    bad = sorted(set(want) ^ set(got)) or sorted(k for k in want if want[k].shape != got[k].shape)
    if bad:
        raise ConfigError(f"{key}={path}: the adapter was trained on base model "
                          f"{adapter_base or '(not recorded)'}, which does not fit "
                          f"{base_model} ({bad[0]}: missing, extra or of another shape)")
    with torch.no_grad():
        for k, v in got.items():
            want[k].copy_(v)


def _to_peft_key(name: str) -> str:
    """Our parameter name -> the key peft writes in ``adapter_model.safetensors``."""
    return "base_model.model." + name.replace(f".{ADAPTER}.weight", ".weight")


def _from_peft_key(key: str) -> str:
    return key.removeprefix("base_model.model.").replace(".lora_A.weight", f".lora_A.{ADAPTER}.weight") \
        .replace(".lora_B.weight", f".lora_B.{ADAPTER}.weight")


def is_adapter_key(name: str) -> bool:
    """Whether the state-dict key ``name`` is a LoRA ``A`` or ``B`` matrix."""
    return any(name.endswith(p) for p in _LORA_PARTS)


def write_adapter_folder(folder: Path | str, plan: LoraPlan, state: dict[str, torch.Tensor]) -> None:
    """Write a peft adapter folder from ``state`` (our names; non-adapter keys are skipped):
    ``adapter_config.json`` and ``adapter_model.safetensors``, loadable with
    ``peft.PeftModel.from_pretrained(base_model, folder)``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plan.config.save_pretrained(str(folder))
    tensors = {_to_peft_key(k): v.detach().cpu().contiguous() for k, v in state.items() if is_adapter_key(k)}
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


@contextlib.contextmanager
def adapter_disabled(module: nn.Module) -> Iterator[None]:
    """Inside, every LoRA layer of ``module`` computes ``base_layer(x)`` only (the base model).

    peft's own ``enable_adapters(False)`` also flips ``requires_grad`` of the adapter, which an
    FSDP2 unit would capture if the reference forward came first; this sets only the layers'
    disable flag and restores it afterwards."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
    before = [m._disable_adapters for m in layers]
    try:
        for m in layers:
            m._disable_adapters = True
        yield
    finally:
        for m, b in zip(layers, before, strict=True):
            m._disable_adapters = b


def adapted_names(plan: LoraPlan, prefix: str = "") -> Callable[[str], bool]:
    """A predicate on engine state-dict names: the base weight, bias or adapter of an adapted layer
    (what :func:`merged_params` needs); ``prefix`` is stripped first (``lm.`` of ``PolicyWithLogZ``)."""
    layers = set(plan.scaling)

    def keep(name: str) -> bool:
        name = name.removeprefix(prefix)
        for marker in (_BASE, ".lora_A.", ".lora_B."):
            if marker in name:
                return name.split(marker, 1)[0] in layers
        return False

    return keep


def merged_params(params: Iterable[tuple[str, torch.Tensor]], plan: LoraPlan,
                  prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(plain name, tensor)`` for the rollout's copy from the engine's ``(name, full tensor)``
    stream: an adapted layer's weight is ``W + scaling * B @ A`` (computed in float32; shapes
    ``W: (out, in)``, ``A: (r, in)``, ``B: (out, r)``), its bias passes through under the plain
    name, other tensors pass through; ``prefix`` is stripped from names first."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in params:
        name = name.removeprefix(prefix)
        if _BASE in name:
            layer, leaf = name.split(_BASE, 1)
            if leaf != "weight":
                yield f"{layer}.{leaf}", t
                continue
            part = "W"
        elif is_adapter_key(name):
            layer = name.rsplit(".lora_", 1)[0]
            part = "A" if ".lora_A." in name else "B"
        else:
            yield name, t
            continue
        parts = pending.setdefault(layer, {})
        parts[part] = t
        if len(parts) == 3:
            del pending[layer]
            w = parts["W"].float() + plan.scaling[layer] * (parts["B"].float() @ parts["A"].float())
            yield f"{layer}.weight", w.to(parts["W"].dtype)
    if pending:
        raise RuntimeError(f"merged_params: incomplete LoRA layers {sorted(pending)[:3]} (base, A and B expected)")
