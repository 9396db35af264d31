"""Reading a role's sharded checkpoint folder (``global_step_N/<role>/``, written by
``torch.distributed.checkpoint``, DCP): its metadata, its load into an engine (resharded to this run's
world size), and its model tensors alone without a process group (``rlforge export``).

A DCP folder holds ``.metadata`` (every saved key's global shape, dtype and where its chunks are) and
one ``__<rank>_<i>.distcp`` file per writing rank.  Keys are the state dict's nested keys joined by dots:
``model.<parameter FQN>``, ``optimizer.state.<FQN>.exp_avg``, ``optimizer.param_groups``,
``scheduler.<field>``.  The FQNs are the plain module's names, the Hugging Face keys.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from rlforge.errors import CheckpointError

METADATA = ".metadata"
"""The file that makes ``<role>/`` a DCP folder (written last by DCP's coordinator rank)."""
MODEL = "model."


def is_sharded(ckpt: Path, role: str) -> bool:
    """True when ``ckpt/role`` is a DCP folder (else the role is saved as ``state.pt``, the full format)."""
    return (Path(ckpt) / role / METADATA).is_file()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{e.__class__.__name__}: {(text.splitlines() or [''])[0][:300]}"


def read_metadata(folder: Path) -> Metadata:
    """DCP's metadata of ``folder``.

    Raises:
        CheckpointError: ``.metadata`` is missing or unreadable (naming the file)."""
    try:
        return FileSystemReader(str(folder)).read_metadata()
    except Exception as e:  # noqa: BLE001 - unpickling garbage raises anything
        raise CheckpointError(f"checkpoint file {folder / METADATA} is missing, corrupt or incomplete "
                              f"({_first_line(e)})") from None


def check_shards(folder: Path, md: Metadata | None = None) -> None:
    """Every shard file the metadata of ``folder`` points into exists and is long enough (a truncated or
    missing ``.distcp`` file; flipped bytes of the same length are the manifest's to find).

    Raises:
        CheckpointError: naming the first such file, its size and the size the metadata needs."""
    md = md or read_metadata(folder)
    need: dict[str, int] = {}
    for info in (md.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if rel is not None:
            need[rel] = max(need.get(rel, 0), int(info.offset) + int(info.length))
    for rel, size in sorted(need.items()):
        f = Path(folder) / rel
        have = f.stat().st_size if f.is_file() else None
        if have is None or have < size:
            what = "is missing" if have is None else f"has {have} bytes, its checkpoint's metadata needs {size}"
            raise CheckpointError(f"checkpoint file {f} {what} (truncated or incomplete); the run does not resume "
                                  "from it")


def model_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Parameter name -> global shape of every model tensor saved in the DCP folder ``folder``."""
    md = read_metadata(folder)
    check_shards(folder, md)
    return {k[len(MODEL):]: tuple(v.size) for k, v in md.state_dict_metadata.items()
            if k.startswith(MODEL) and isinstance(v, TensorStorageMetadata)}


def _template_shapes(state: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.get("model", {}).items() if hasattr(v, "shape")}


def load_into(engine: Any, folder: Path, model_key: str, reference: dict[str, tuple[int, ...]] | None = None) -> None:
    """Load the DCP folder ``folder`` into ``engine`` on every rank, resharded to this run's layout.

    ``reference`` (parameter name -> shape, HF names) and the engine's own global shapes are compared
    with the saved ones first, so another model is one error naming both shapes.

    Raises:
        CheckpointError: another model (naming the parameter, both shapes and ``model_key``), an
            unreadable or corrupt shard (naming the folder and DCP's reason), or an engine that loads
            only full states.
    """
    from rlforge.trainer.checkpoint import state_mismatch

    saved = model_shapes(folder)
    fix = "resume with the same model settings or set trainer.resume_mode=disable"

    def read(template: dict[str, Any]) -> None:
        for ref in (reference, _template_shapes(template)):
            why = state_mismatch(saved, ref) if ref else None
            if why is not None:
                raise CheckpointError(f"checkpoint {folder} does not fit the model built from {model_key}.*: {why}; {fix}")
        missing = sorted(set(_template_shapes(template)) - set(saved))
        if missing:
            raise CheckpointError(f"checkpoint {folder} does not fit the model built from {model_key}.*: parameter "
                                  f"{missing[0]!r} is not in the checkpoint ({len(missing)} missing); {fix}")
        try:
            dcp.load(template, checkpoint_id=str(folder))
        except Exception as e:  # noqa: BLE001 - DCP wraps every rank's failure in its own exception types
            raise CheckpointError(f"checkpoint {folder} cannot be read ({_first_line(e)}); the run does not resume "
                                  "from it") from None

    try:
        engine.load_sharded_state(read)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {folder} is sharded (DCP): {e}; resume with strategy fsdp or fsdp2") from None


def load_model_state(folder: Path) -> dict[str, torch.Tensor]:
    """The full model tensors (HF names -> CPU tensor, the saved dtype) of the DCP folder ``folder``, read in
    one process without a process group (``no_dist``); the optimizer state is not read.

    Raises:
        CheckpointError: unreadable metadata or shard (naming the folder)."""
    md = read_metadata(folder)
    check_shards(folder, md)
    model: dict[str, torch.Tensor] = {}
    for key, meta in md.state_dict_metadata.items():
        if key.startswith(MODEL) and isinstance(meta, TensorStorageMetadata):
            model[key[len(MODEL):]] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not model:
        raise CheckpointError(f"checkpoint {folder} holds no model state")
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({"model": model}, checkpoint_id=str(folder), no_dist=True)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"checkpoint {folder} cannot be read ({_first_line(e)})") from None
    return model


def saved_model_state(ckpt: str | Path, role: str = "actor") -> dict[str, torch.Tensor]:
    """The full model state (HF names -> CPU tensor) of ``role`` in the checkpoint folder ``ckpt``,
    sharded (DCP) or full format (``<role>/state.pt``), read in one process.

    Raises:
        CheckpointError / ConfigError: the part is missing or unreadable (naming the file)."""
    ckpt = Path(ckpt)
    if is_sharded(ckpt, role):
        return load_model_state(ckpt / role)
    from rlforge.trainer.checkpoint import load_part

    return load_part(ckpt, role)["model"]
