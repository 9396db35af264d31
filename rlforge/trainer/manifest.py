"""Checksums of a checkpoint's files: ``global_step_N/manifest.json``.

``{"format": 1, "files": {"<path relative to the checkpoint>": {"sha256": hex, "size": bytes}}}``,
written after every other file of the checkpoint (and so before the tracker file names it) and
checked before a resume reads anything.  A checkpoint without a manifest (written by an older
rlforge) loads with one warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

from rlforge.errors import CheckpointError

MANIFEST = "manifest.json"
_STEP = re.compile(r"global_step_(\d+)")
_CHUNK = 1 << 20  # bytes read per hashing step

log = logging.getLogger(__name__)


def sha256_file(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes (hex), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _older_with_manifest(folder: Path) -> Path | None:
    """The newest ``global_step_M`` sibling of ``folder`` (a ``global_step_N``) with ``M < N`` that has a
    manifest, or None (also when ``folder`` is not named ``global_step_N``)."""
    m = _STEP.fullmatch(folder.name)
    if m is None or not folder.parent.is_dir():
        return None
    steps = []
    for p in folder.parent.iterdir():
        q = _STEP.fullmatch(p.name)
        if q and int(q.group(1)) < int(m.group(1)) and (p / MANIFEST).is_file():
            steps.append((int(q.group(1)), p))
    return max(steps)[1] if steps else None


def write_manifest(folder: str | Path) -> Path:
    """Hash every file under ``folder`` into ``folder/manifest.json``; returns its path."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size}
             for p in _files(folder)}
    out = folder / MANIFEST
    out.write_text(json.dumps({"format": 1, "files": files}, indent=1, sort_keys=True))
    return out


def verify_manifest(folder: str | Path) -> bool:
    """Check every file listed in ``folder/manifest.json`` against its size and SHA-256.

    Returns:
        True when verified; False (after one warning) when the checkpoint has no manifest and no older
        checkpoint beside it has one (written by an older rlforge).

    Raises:
        CheckpointError: a listed file is missing, has another size or another hash (naming the
            file and the checkpoint), a file of the checkpoint is not listed, a listed path leaves the
            checkpoint, the manifest itself is unreadable, or it is missing while an older
            ``global_step_M`` beside the checkpoint has one (so this rlforge wrote it: deleted, not old).
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        older = _older_with_manifest(folder)
        if older is not None:  # this rlforge wrote manifests before this checkpoint: deleted or lost, not old
            raise CheckpointError(f"checkpoint {folder}: {MANIFEST} is missing, though the earlier checkpoint "
                                  f"{older.name} has one (deleted, or not copied); its files cannot be checked")
        log.warning("checkpoint %s has no %s (written by an older rlforge): its files cannot be checked for "
                    "corruption", folder, MANIFEST)
        return False
    try:
        files = json.loads(path.read_text())["files"]
        items = [(str(k), str(v["sha256"]), int(v["size"])) for k, v in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {folder}: {MANIFEST} is unreadable ({e.__class__.__name__}); "
                              "the checkpoint cannot be trusted") from None
    listed = {rel for rel, _, _ in items}
    unlisted = [p.relative_to(folder).as_posix() for p in _files(folder)
                if p.relative_to(folder).as_posix() not in listed]
    if unlisted:
        raise CheckpointError(f"checkpoint {folder}: file {unlisted[0]} is not in {MANIFEST} "
                              f"({len(unlisted)} unlisted); the manifest does not describe this checkpoint")
    for rel, digest, size in items:
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise CheckpointError(f"checkpoint {folder}: {MANIFEST} lists {rel!r}, outside the checkpoint")
        f = folder / rel
        if not f.is_file():
            problem = "is missing"
        elif f.stat().st_size != size:
            problem = f"has {f.stat().st_size} bytes, the manifest says {size}"
        elif sha256_file(f) != digest:
            problem = "does not match its SHA-256 in the manifest (corrupted on disk or in transfer)"
        else:
            continue
        raise CheckpointError(f"checkpoint {folder}: file {rel} {problem}")
    return True
