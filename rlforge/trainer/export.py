"""``rlforge export CHECKPOINT --out HF_DIR``: a Hugging Face folder (model + tokenizer,
safetensors) from a saved checkpoint.

The FSDP engines save the actor sharded (``global_step_N/actor/.metadata`` and one ``.distcp`` file per
rank: :mod:`rlforge.trainer.checkpointer`), whose model tensors are read here in one process without a
GPU or a process group (:func:`rlforge.trainer.dcp_io.load_model_state`); megatron, LoRA adapters and
older rlforge versions save a full, HF-keyed state dict in ``global_step_N/actor/state.pt``
(:mod:`rlforge.trainer.checkpoint`).  Both hold HF keys, so one path serves them all: the model is rebuilt from the run's config on the ``meta`` device
(no weights are read or initialised twice), the checkpoint's tensors are assigned to it, and the
model and the tokenizer are written with ``save_pretrained``.

Where the model comes from, first match wins:

1. ``model_path`` (``--model-path``; with ``--tokenizer-path``), for checkpoints without the next two;
2. ``global_step_N/config.yaml`` (written since ``rlforge export`` exists):
   ``actor_rollout_ref.model.{path,tokenizer_path,override_config}``;
3. ``global_step_N/actor/huggingface`` (``actor.checkpoint.save_contents`` with ``hf_model``): its
   ``config.json`` and tokenizer.

A policy loss's log Z head (added by its hooks) is not part of the LM; it is written as
``log_z_head.safetensors`` only where the run's config says so to the loss's hooks
(``exports_extra_modules``), as the run's own ``hf_model`` export does.  ``override_config.attn_implementation`` is a run-time kernel choice and
is not written into the exported ``config.json``.

A LoRA checkpoint (``model.lora_rank > 0``) holds the adapter only (and its settings, ``lora``):
the base model is loaded from the run's model path with its weights, the adapter is injected
and loaded, and ``out`` becomes a peft adapter folder (``adapter_config.json``,
``adapter_model.safetensors``, the tokenizer; ``peft.PeftModel.from_pretrained(base, out)``), or
with ``merge=True`` (``--merge``) a plain Hugging Face model with ``W + scaling * B @ A`` merged in.
A LoRA run's export-only save (``save_contents=[hf_model]`` alone: ``actor/huggingface`` is a peft
adapter folder) exports only with ``--merge``: the run's base model with the adapter merged in
(peft's ``merge_and_unload``).

Before anything is read, the checkpoint's files are checked against its ``manifest.json``
(:func:`rlforge.trainer.manifest.verify_manifest`, as a resume does): a file that does not match, or
an unreadable manifest, is one error naming it; a checkpoint without one (an older rlforge) exports
with one warning.  An export-only save (``save_contents=[hf_model]``) has no manifest and is not
checked.  Whatever the source, an export whose tensors hold NaN or inf is not written.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

from rlforge.errors import CheckpointError
from rlforge.file_modes import follow_umask
from rlforge.trainer.manifest import verify_manifest

# torch is imported inside the functions: the CLI builds this command's parser on every start-up.
DTYPES = ("float32", "bfloat16", "float16")
"""``--dtype`` choices: the dtype of the exported weights (the checkpoint's master weights are float32)."""

TRACKER = "latest_checkpointed_iteration.txt"  # = rlforge.trainer.checkpoint.TRACKER (which imports torch)
CONFIG_FILE = "config.yaml"  # = rlforge.trainer.checkpoint.CONFIG_FILE
_HF_EXPORT = Path("actor") / "huggingface"
_ADAPTER_CONFIG = "adapter_config.json"  # a peft adapter folder (a LoRA run's hf_model export)
_DCP_METADATA = ".metadata"  # = rlforge.trainer.dcp_io.METADATA (which imports torch)
_NOT_A_CHECKPOINT = ("expected a global_step_N folder with actor/state.pt or actor/.metadata, or a run folder "
                     f"(trainer.default_local_dir) with {TRACKER}")


def _step_of(hf: Path) -> int:
    """N of ``.../global_step_N/actor/huggingface`` (-1 when N is not a number)."""
    n = hf.parent.parent.name.rsplit("_", 1)[-1]
    return int(n) if n.isdigit() else -1


def _has_actor(ckpt: Path) -> bool:
    """The actor is saved: full format (``actor/state.pt``) or sharded (``actor/.metadata``, DCP)."""
    return (ckpt / "actor" / "state.pt").is_file() or (ckpt / "actor" / _DCP_METADATA).is_file()


def _actor_part(ckpt: Path) -> tuple[dict[str, Any], Path]:
    """The actor's saved state (``{"model": HF-keyed tensors, ...}``) and the file or folder it came from:
    a sharded checkpoint's model tensors are read in this process (no GPU, no process group)."""
    if (ckpt / "actor" / _DCP_METADATA).is_file():
        from rlforge.trainer.dcp_io import load_model_state

        return {"model": load_model_state(ckpt / "actor")}, ckpt / "actor"
    from rlforge.trainer.checkpoint import load_part

    return load_part(ckpt, "actor"), ckpt / "actor" / "state.pt"


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder ``path`` names: a ``global_step_N`` folder, or a run folder whose
    tracker file names its latest checkpoint.

    Raises:
        CheckpointError: ``path`` is missing or is not a checkpoint (the message names it).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointError(f"{path}: no such file or folder ({_NOT_A_CHECKPOINT})")
    if _has_actor(p):
        return p
    sft = _sft_model(p)
    if sft is not None:
        raise CheckpointError(f"{path} is an SFT run's checkpoint, whose Hugging Face folder needs no export: load "
                              f"{sft} as it is (rlforge train actor_rollout_ref.model.path={sft})")
    tracker = p / TRACKER
    if tracker.is_file():
        step = tracker.read_text().strip()
        latest = p / f"global_step_{step}"
        if step.isdigit() and _has_actor(latest):
            return latest
        raise CheckpointError(f"{tracker} points to global_step_{step}, which is not a complete checkpoint; "
                              "pass one of the run's global_step_N folders instead")
    if (p / "trainer_state.pt").is_file():
        raise CheckpointError(f"{path}: this checkpoint has neither actor/state.pt nor actor/{_DCP_METADATA} "
                              "(the actor was not saved)")
    hf = _exported_folder(p)
    if hf is not None and (hf / _ADAPTER_CONFIG).is_file():  # LoRA with save_contents=[hf_model] alone
        raise CheckpointError(f"{path} holds only the policy's LoRA adapter folder (save_contents=[hf_model]): "
                              f"pass --merge to write the base model with the adapter merged in, or load {hf} "
                              "with peft.PeftModel.from_pretrained(base_model, folder)")
    if hf is not None:  # actor.checkpoint.save_contents=[hf_model] alone: the folder already is the model
        raise CheckpointError(f"{path} holds only the policy's Hugging Face folder (save_contents=[hf_model]), "
                              f"which needs no export: load {hf} as it is")
    raise CheckpointError(f"{path}: not an rlforge checkpoint ({_NOT_A_CHECKPOINT})")


def _sft_model(p: Path) -> Path | None:
    """The model folder of an SFT checkpoint (``rlforge sft``: ``global_step_N/huggingface``, no ``actor/``), of
    the ``global_step_N`` folder ``p`` or of the run folder ``p``'s latest checkpoint; None otherwise."""
    tracker = p / TRACKER
    step = tracker.read_text().strip() if tracker.is_file() else ""
    for folder in (p, p / f"global_step_{step}") if step else (p,):
        if (folder / "huggingface" / "config.json").is_file() and not (folder / "actor").exists():
            return folder / "huggingface"
    return None


def _exported_folder(p: Path) -> Path | None:
    """The newest ``actor/huggingface`` folder (a model's ``config.json`` or a peft adapter's
    ``adapter_config.json``) of the ``global_step_N`` or run folder ``p``; None when there is none."""
    def saved(folder: Path) -> bool:
        return (folder / "config.json").is_file() or (folder / _ADAPTER_CONFIG).is_file()

    if saved(p / _HF_EXPORT):
        return p / _HF_EXPORT
    found = sorted((f for f in p.glob(f"global_step_*/{_HF_EXPORT}") if saved(f)), key=_step_of)
    return found[-1] if found else None


def _model_source(ckpt: Path, model_path: str | None, tokenizer_path: str | None) -> dict[str, Any]:
    """``{path, tokenizer_path, override_config, export_log_z}`` of the checkpoint's actor."""
    if model_path:
        return {"path": model_path, "tokenizer_path": tokenizer_path, "override_config": {}, "export_log_z": False,
                "seed": 1}
    cfg_file = ckpt / CONFIG_FILE
    if cfg_file.is_file():
        from omegaconf import OmegaConf

        try:
            cfg = OmegaConf.load(cfg_file)
        except Exception as e:  # noqa: BLE001 - yaml and OmegaConf errors share no base class
            raise CheckpointError(f"{cfg_file}: cannot read the run's config ({e.__class__.__name__}); "
                                  "pass --model-path") from None
        model = OmegaConf.select(cfg, "actor_rollout_ref.model")
        if model is None or not OmegaConf.select(model, "path"):
            raise CheckpointError(f"{cfg_file} has no actor_rollout_ref.model.path; pass --model-path")
        node = OmegaConf.select(model, "override_config")
        override = OmegaConf.to_container(node, resolve=True) if node is not None else {}
        return {"path": str(model.path), "tokenizer_path": tokenizer_path or model.get("tokenizer_path"),
                "override_config": dict(override or {}),
                "export_log_z": _exports_extras(OmegaConf.select(cfg, "actor_rollout_ref.actor")),
                "seed": int(OmegaConf.select(cfg, "data.seed", default=None) or 1)}  # a preset's weights
    hf = ckpt / _HF_EXPORT
    if (hf / "config.json").is_file():
        return {"path": str(hf), "tokenizer_path": tokenizer_path, "override_config": {}, "export_log_z": False,
                "seed": 1}
    raise CheckpointError(f"{ckpt} has neither {CONFIG_FILE} nor {_HF_EXPORT}/config.json, so the model it was "
                          "trained from is unknown; pass --model-path (the run's actor_rollout_ref.model.path)")


def _exports_extras(actor: Any) -> bool:
    """Whether the run's policy loss (``actor.policy_loss.loss_mode``) exports its extra modules."""
    from omegaconf import OmegaConf

    from rlforge.algorithms import POLICY_LOSSES, loss_hooks

    mode = OmegaConf.select(actor, "policy_loss.loss_mode") if actor is not None else None
    if mode not in POLICY_LOSSES:
        return False
    return loss_hooks(POLICY_LOSSES.get(mode)).exports_extras(actor)


def _split_log_z(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The state of an actor with a log Z head (``lm.*`` and ``log_z_head.*``) as the LM's and the head's; others unchanged."""
    if not any(k.startswith("log_z_head.") for k in state):
        return state, {}
    lm = {k.removeprefix("lm."): v for k, v in state.items() if k.startswith("lm.")}
    head = {k.removeprefix("log_z_head."): v for k, v in state.items() if k.startswith("log_z_head.")}
    return lm, head


def build_model(source: dict[str, Any], state: dict[str, Any], where: Path) -> tuple[Any, Any]:
    """The tokenizer and the causal LM of ``source`` holding ``state``'s tensors (float32, CPU).

    Raises:
        ModelError: the model or tokenizer path cannot be loaded.
        CheckpointError: the state does not fit the model (another architecture or override).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from rlforge.models import load_tokenizer
    from rlforge.models.loader import model_config

    tok = load_tokenizer(source["path"], source["tokenizer_path"])
    override = {k: v for k, v in source["override_config"].items() if k != "attn_implementation"}
    config = model_config(source["path"], tok, override)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in state.items()}
    result = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters(remove_duplicate=False) if p.is_meta]
    if result.unexpected_keys or missing:
        bad = (f"unexpected keys {result.unexpected_keys[:3]}" if result.unexpected_keys else
               f"missing keys {missing[:3]}")
        raise CheckpointError(f"{where}: the saved weights do not fit the model built from {source['path']} "
                              f"(override_config={override}): {bad}; pass --model-path with the run's model")
    model.config.pad_token_id = tok.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return tok, model.eval()


def _lora_model(source: dict[str, Any], lora: dict[str, Any], state: dict[str, Any],
                where: Path) -> tuple[Any, Any, Any]:
    """The tokenizer, the base causal LM of ``source`` (its weights loaded) with the saved
    adapter (``lora``: :meth:`rlforge.models.lora.LoraPlan.state`; ``state``: its tensors) injected,
    and the adapter's :class:`~rlforge.models.lora.LoraPlan`.

    Raises:
        CheckpointError: the adapter does not fit that base model.
    """
    from peft import inject_adapter_in_model

    from rlforge.models import load_causal_lm, load_tokenizer
    from rlforge.models.lora import ADAPTER, is_adapter_key, plan_from_state

    tok = load_tokenizer(source["path"], source["tokenizer_path"])
    override = {k: v for k, v in source["override_config"].items() if k != "attn_implementation"}
    model = load_causal_lm(source["path"], tok, override, seed=source["seed"])
    plan = plan_from_state(lora)
    inject_adapter_in_model(plan.config, model, adapter_name=ADAPTER)
    adapter = {k: v for k, v in state.items() if is_adapter_key(k)}
    result = model.load_state_dict(adapter, strict=False)
    missing = [k for k in result.missing_keys if is_adapter_key(k)]
    if result.unexpected_keys or missing:
        raise CheckpointError(f"{where}: the saved adapter does not fit the model built from {source['path']}: "
                              f"{(result.unexpected_keys or missing)[:3]}; pass --model-path with the run's model")
    return tok, model.eval(), plan


def export_checkpoint(checkpoint: str | Path, out: str | Path, dtype: str = "float32",
                      model_path: str | None = None, tokenizer_path: str | None = None,
                      merge: bool = False) -> Path:
    """Write the actor of ``checkpoint`` (a ``global_step_N`` or run folder) to ``out`` as a
    Hugging Face folder: ``config.json``, ``model.safetensors`` (or shards), the generation config
    and the tokenizer; for a LoRA checkpoint a peft adapter folder, or the merged model with
    ``merge``.  ``out`` is written into a temporary sibling and renamed into place.
    Returns the checkpoint folder exported.

    Raises:
        CheckpointError: not a checkpoint, unreadable, weights that do not fit, ``out`` not empty.
        ModelError: the run's model or tokenizer path cannot be loaded.
    """
    import torch

    if dtype not in DTYPES:
        raise CheckpointError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")
    adapter = _adapter_only(checkpoint) if merge else None
    ckpt = adapter.parent.parent if adapter is not None else find_checkpoint(checkpoint)
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"--out {out}: exists and is not an empty folder; choose a new folder")
    if adapter is not None:
        tok, model = merge_adapter_folder(adapter, _model_source(ckpt, model_path, tokenizer_path))
        _check_finite(model.state_dict(), adapter)
        _check_finite(model.to(getattr(torch, dtype)).state_dict(), adapter, dtype)
        _write(out, model, tok)
        return ckpt
    try:  # before anything is read: raises naming the file, or warns when there is no manifest (older rlforge)
        verify_manifest(ckpt)
    except CheckpointError as e:
        raise CheckpointError(f"{e}; nothing was exported (export an earlier checkpoint, or copy this one "
                              "again)") from None
    source = _model_source(ckpt, model_path, tokenizer_path)
    part, where = _actor_part(ckpt)
    try:
        state = part["model"]
    except (KeyError, TypeError):
        raise CheckpointError(f"{where} holds no model state") from None
    lm_state, head_state = _split_log_z(state)
    plan = None
    if part.get("lora"):
        tok, model, plan = _lora_model(source, part["lora"], lm_state, where)
        if merge:
            from peft.tuners.tuners_utils import BaseTunerLayer

            for name, m in list(model.named_modules()):
                if isinstance(m, BaseTunerLayer):
                    m.merge()
                    parent, _, leaf = name.rpartition(".")
                    setattr(model.get_submodule(parent) if parent else model, leaf, m.get_base_layer())
            plan = None
    else:
        if merge:
            raise CheckpointError(f"--merge: {ckpt} is not a LoRA checkpoint (it holds the full model already)")
        tok, model = build_model(source, lm_state, where)
    extras = head_state if source["export_log_z"] else {}
    _check_finite({**model.state_dict(), **{f"log_z_head.{k}": v for k, v in extras.items()}}, where)
    _check_finite(model.to(getattr(torch, dtype)).state_dict(), where, dtype)
    _write(out, model, tok, plan, extras)
    return ckpt


def _check_finite(tensors: dict[str, Any], where: Path, dtype: str | None = None) -> None:
    """Refuse NaN or inf in ``tensors`` (name -> tensor; a model's ``state_dict``): as read from the
    checkpoint (``dtype`` None), or after the cast to ``--dtype`` ``dtype`` (out of its range).

    Raises:
        CheckpointError: one line naming ``where`` and the first tensor with a NaN or inf value.
    """
    import torch

    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            why = ("the checkpoint holds them (corrupted, or a diverged run)" if dtype is None
                   else f"they appear in --dtype {dtype} (out of its range); export in float32")
            raise CheckpointError(f"{where}: tensor {name} has {bad} NaN/inf value(s) of {t.numel()}: {why}; "
                                  "nothing was written")


def _adapter_only(checkpoint: str | Path) -> Path | None:
    """The peft adapter folder (``actor/huggingface``) of a LoRA run's export-only save
    (``save_contents=[hf_model]``) that ``checkpoint`` names; None for anything else."""
    p = Path(checkpoint).expanduser()
    if not p.is_dir() or _has_actor(p) or (p / TRACKER).is_file():
        return None
    hf = _exported_folder(p)
    return hf if hf is not None and (hf / _ADAPTER_CONFIG).is_file() else None


def merge_adapter_folder(adapter: Path, source: dict[str, Any]) -> tuple[Any, Any]:
    """The tokenizer and the base causal LM of ``source`` (float32, CPU) with the peft adapter
    folder ``adapter`` merged in (``W + scaling * B @ A``: peft's ``merge_and_unload``).

    Raises:
        CheckpointError: the adapter does not fit that base model.
    """
    from peft import PeftModel

    from rlforge.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer(source["path"], source["tokenizer_path"])
    override = {k: v for k, v in source["override_config"].items() if k != "attn_implementation"}
    base = load_causal_lm(source["path"], tok, override, seed=source["seed"])
    try:
        merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{adapter}: the adapter does not fit the model built from {source['path']} "
                              f"({e.__class__.__name__}: {(str(e).splitlines() or [''])[0][:200]}); "
                              "pass --model-path with the run's model") from None
    return tok, merged.eval()


def _write(out: Path, model: Any, tok: Any, plan: Any = None, extras: dict[str, Any] | None = None) -> None:
    """``model`` (a peft adapter folder when ``plan`` is given) and ``tok`` into ``out``, through a
    temporary sibling renamed into place; ``extras`` (a log Z head) as ``log_z_head.safetensors``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if plan is not None:
            from rlforge.models.lora import write_adapter_folder

            write_adapter_folder(tmp, plan, dict(model.state_dict()))
        else:
            model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if extras:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in extras.items()}, str(tmp / "log_z_head.safetensors"))
        follow_umask(tmp)  # safetensors writes 0600 files
        if out.exists():
            out.rmdir()  # checked empty by the caller
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def add_export_parser(sub: Any) -> None:
    """The ``rlforge export`` sub-command on the CLI's sub-parsers ``sub``."""
    e = sub.add_parser(
        "export", help="write a Hugging Face folder (model + tokenizer) from a checkpoint",
        description="Write the actor of an rlforge checkpoint as a Hugging Face folder (config.json, safetensors "
        "weights, tokenizer) that transformers' AutoModelForCausalLM.from_pretrained loads. CHECKPOINT is a "
        "global_step_N folder, or a run folder (trainer.default_local_dir) for its latest checkpoint.")
    e.add_argument("checkpoint", metavar="CHECKPOINT", help="a global_step_N folder, or a run folder")
    e.add_argument("--out", required=True, metavar="HF_DIR", help="output folder (new, or empty)")
    e.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="dtype of the written weights (default float32: the master weights as trained)")
    e.add_argument("--model-path", default=None, metavar="P",
                   help="the run's actor_rollout_ref.model.path, for checkpoints that lack config.yaml")
    e.add_argument("--merge", action="store_true",
                   help="LoRA checkpoints: write the merged model (base + adapter) instead of a peft adapter folder")
    e.add_argument("--tokenizer-path", default=None, metavar="P",
                   help="a tokenizer other than the run's (default: the run's model.tokenizer_path or model)")


def run_export(args: argparse.Namespace) -> int:
    """``rlforge export``: export, print where, return 0 (user errors propagate as RLForgeError)."""
    ckpt = export_checkpoint(args.checkpoint, args.out, args.dtype, args.model_path, args.tokenizer_path, args.merge)
    print(f"wrote {args.out} (Hugging Face model + tokenizer) from {ckpt}", flush=True)
    return 0
