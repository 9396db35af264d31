"""Files rlforge writes follow the process's umask (``0644`` files and ``0755`` folders under the usual
``022``), as a plain ``open(..., "w")`` does.

``safetensors.torch.save_file`` (so ``save_pretrained``) writes through a private temporary file and
leaves ``model.safetensors`` at ``0600``, and ``tempfile.mkdtemp`` makes ``0700`` folders; a folder
that rlforge renames into place (a checkpoint, an export, the GGUF conversion cache) is passed through
:func:`follow_umask` first.
"""

from __future__ import annotations

import os
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read from ``/proc/self/status`` where it can be (no change of process
    state), else by setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(folder: str | Path) -> None:
    """Give ``folder``, every folder under it (``0777 & ~umask``) and every file under it
    (``0666 & ~umask``) the mode a plain create would have; links are left alone."""
    mask = current_umask()
    root = Path(folder)
    os.chmod(root, 0o777 & ~mask)
    for here, dirs, files in os.walk(root):
        for name in dirs:
            p = Path(here) / name
            if not p.is_symlink():
                os.chmod(p, 0o777 & ~mask)
        for name in files:
            p = Path(here) / name
            if not p.is_symlink():
                os.chmod(p, 0o666 & ~mask)
