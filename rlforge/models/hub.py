"""Hugging Face Hub model ids (``Qwen/Qwen2.5-0.5B-Instruct``) as model paths.

A model path that is not an existing local file or folder but has the form ``org/name`` is
fetched with :func:`huggingface_hub.snapshot_download` into the Hugging Face cache
(``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``) and read from there, as transformers
does.  When offline (``HF_HUB_OFFLINE=1``, or the Hub cannot be reached) a model already in
the cache is used as it is; one that is not gives one :class:`~rlforge.errors.ModelError` line
naming the cache folder and how to get the model.

Only what a PyTorch model needs is fetched: configs, tokenizer files and the ``*.safetensors``
weights, or the ``*.bin`` weights when the repository has no safetensors (other formats a
repository may hold, such as GGUF, ONNX, TensorFlow and Flax, are skipped).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlforge.errors import ModelError

# Files transformers reads for a PyTorch model and its tokenizer (``*.py``: trust_remote_code).
_MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py"]
_FALLBACK_WEIGHTS = ["*.bin"]


def is_hub_id(path: str) -> bool:
    """True when ``path`` reads as a Hub model id ``org/name`` (exactly one ``/``, Hub characters
    only); a local path such as ``./x``, ``/x`` or ``~/x`` never does."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if path.count("/") != 1 or path.startswith(("/", ".", "~")) or path.endswith("/"):
        return False
    try:
        validate_repo_id(path)
    except HFValidationError:
        return False
    return True


def hub_snapshot(repo_id: str, key: str) -> Path:
    """The local folder of ``repo_id``'s snapshot (``main``), downloaded into the Hugging Face
    cache first when online.

    Raises:
        ModelError: one line naming ``key`` when the model is not in the cache and cannot be
            downloaded (offline, no network, no such repository, gated, or the download failed).
    """
    from huggingface_hub import snapshot_download

    with _hub_errors(repo_id, key):
        folder = Path(snapshot_download(repo_id, allow_patterns=_MODEL_FILES))
        if not any(folder.glob("*.safetensors")) and (folder / "config.json").exists():
            folder = Path(snapshot_download(repo_id, allow_patterns=_FALLBACK_WEIGHTS))
    return folder


@contextmanager
def _hub_errors(repo_id: str, key: str) -> Iterator[None]:
    """Turn huggingface_hub's download errors into one :class:`ModelError` line."""
    try:
        yield
    except (OSError, ValueError) as e:
        raise ModelError(_message(repo_id, key, e)) from None


def _message(repo_id: str, key: str, err: BaseException) -> str:
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    head = f"{key}={repo_id}"
    if isinstance(err, LocalEntryNotFoundError):  # offline (or no network) and not (fully) cached
        why = "HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else "the Hugging Face Hub cannot be reached"
        return (f"{head}: the model is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}. "
                f"Run once with internet to download it, or `hf download {repo_id}` (huggingface-cli download), "
                "or give a local model folder")
    if isinstance(err, GatedRepoError):
        return (f"{head}: a gated model on the Hugging Face Hub; accept its license on huggingface.co/{repo_id} "
                "and log in (`hf auth login`), or give a local model folder")
    if isinstance(err, RepositoryNotFoundError):
        return (f"{head}: no such file or folder, and no model {repo_id!r} on the Hugging Face Hub (a private "
                "repository needs `hf auth login`). Give a local Hugging Face model folder, a .gguf file or a Hub id")
    first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
    return f"{head}: cannot download it from the Hugging Face Hub ({err.__class__.__name__}: {first})"
