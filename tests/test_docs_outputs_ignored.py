"""What the README's and docs/'s example commands write inside the clone is git-ignored, so that following
them leaves no untracked folders (issue 43).

The commands are read from the fenced code blocks of README.md and docs/*.md, as a user would copy them, and
their output paths found from their arguments (``--out``/``--local_save_dir``, ``-o``/``--output``,
``trainer.default_local_dir=``, ``save_pretrained("...")``, ``python3 -m venv DIR``) or, where a command is
given none, from its default (``rlforge train``: the schema's ``trainer.default_local_dir``; ``rlforge perf
report RUN``: ``RUN/report``; a benchmark script: its ``--out`` default).  ``git check-ignore`` then checks each.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OUT_FLAGS = {"--out", "--local_save_dir", "-o", "--output", "--output-dir", "--output_dir"}
# what a command leaves in the clone that none of its arguments names (its program -> those paths)
SIDE_EFFECTS = {
    "pip install -e": ["rlforge.egg-info/", "build/"],
    "pytest": [".pytest_cache/", "tests/__pycache__/", "rlforge/__pycache__/"],
}
_FENCE = re.compile(r"^```(\w*)\s*$")
_SAVE_PRETRAINED = re.compile(r"""\.save_pretrained\(\s*["']([^"']+)["']""")
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # DIR, RUN_DIR, HF_DIR: a word for the user to fill in


def code_blocks(path: Path) -> list[tuple[str, str]]:
    """``(language, text)`` of each fenced code block of the markdown file ``path``."""
    blocks, lang, lines = [], None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _FENCE.match(line.strip())
        if m and lang is None:
            lang, lines = m.group(1), []
        elif line.strip() == "```" and lang is not None:
            blocks.append((lang, "\n".join(lines)))
            lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments and heredoc bodies dropped,
    split on ``&&``, ``||``, ``;`` and ``|``; each a list of words."""
    joined, heredoc_end = [], None
    for line in text.replace("\\\n", " ").splitlines():
        if heredoc_end is not None:
            heredoc_end = None if line.strip() == heredoc_end else heredoc_end
            continue
        m = _HEREDOC.search(line)
        heredoc_end = m.group(1) if m else None
        joined.append(_HEREDOC.sub("", line))
    commands = []
    for line in joined:
        words: list[str] = []
        for word in shlex.split(line, comments=True):
            if word in ("&&", "||", ";", "|"):
                commands.append(words)
                words = []
            else:
                words.append(word)
        commands.append(words)
    return [c for c in commands if c]


def _flag_values(words: list[str], flags: set[str]) -> list[str]:
    found = []
    for i, w in enumerate(words):
        name, eq, value = w.partition("=")
        if name in flags and eq:
            found.append(value)
        elif w in flags and i + 1 < len(words):
            found.append(words[i + 1])
    return found


def _script_out_default(script: Path) -> str | None:
    """The ``--out`` default of a benchmark script (read from its source, not imported)."""
    m = re.search(r"""add_argument\(\s*["']--out["'][^)]*?default=["']([^"']+)["']""", script.read_text())
    return m.group(1) if m else None


def _default_run_dir() -> str:
    """``trainer.default_local_dir``'s schema default, up to its first interpolation (``checkpoints/``)."""
    from rlforge.config.trainer import TrainerConfig

    return TrainerConfig.__dataclass_fields__["default_local_dir"].default.split("$")[0]


def _folders(values: list[str]) -> list[str]:
    return [v.rstrip("/") + "/" for v in values]


def command_outputs(words: list[str]) -> list[str]:
    """The paths inside the clone that the command ``words`` writes (folders end in ``/``); [] for
    a command that writes nothing there.  Paths outside the clone (``~``, absolute) are left out."""
    run_dir = _flag_values(words, {"trainer.default_local_dir", "+trainer.default_local_dir",
                                   "--trainer.default_local_dir"})
    found = _folders(_flag_values(words, OUT_FLAGS - {"-o", "--output"}) + run_dir)
    if words[0] != "pytest":  # pytest's -o sets an ini option
        found += _flag_values(words, {"-o", "--output"})
    module = words[2] if words[0] in ("python", "python3") and words[1:2] == ["-m"] and len(words) > 2 else None
    if module == "venv" and len(words) > 3:
        found += _folders(words[3:4])
    if (words[:2] == ["rlforge", "train"] or module == "rlforge.trainer.main_ppo") and not run_dir:
        found.append(_default_run_dir())
    if words[:3] == ["rlforge", "perf", "report"] and len(words) > 3 and not _flag_values(words, {"--out"}):
        found += _folders([words[3].rstrip("/") + "/report"])
    script = ROOT / words[1] if words[0] in ("python", "python3") and len(words) > 1 else None
    if script is not None and script.suffix == ".py" and script.is_file() and not _flag_values(words, {"--out"}):
        found += _folders([d for d in [_script_out_default(script)] if d])
    line = " ".join(words)
    found += [p for prefix, paths in SIDE_EFFECTS.items() if line.startswith(prefix) for p in paths]
    return [p for p in found if not p.startswith(("~", "/", "$")) and not _PLACEHOLDER.match(p.rstrip("/"))]


def documented_outputs() -> dict[str, list[str]]:
    """Each documented output path inside the clone -> where it comes from (``file: command``)."""
    outputs: dict[str, list[str]] = {}
    for doc in DOCS:
        for lang, text in code_blocks(doc):
            found: list[tuple[str, str]] = [(p + "/", f"save_pretrained({p!r})") for p in _SAVE_PRETRAINED.findall(text)]
            if lang in ("bash", "sh", "shell", "console", ""):
                found += [(p, " ".join(c)[:90]) for c in shell_commands(text) for p in command_outputs(c)]
            for path, what in found:
                path = re.sub(r"^(\./)+", "", path)
                outputs.setdefault(path, []).append(f"{doc.relative_to(ROOT)}: {what}")
    return outputs


def test_parser_finds_the_documented_outputs() -> None:
    """The parser sees the README's outputs (a guard for the check below, which passes vacuously otherwise)."""
    outputs = documented_outputs()
    assert "checkpoints/rlforge/verl_style/" in outputs  # README: trainer.default_local_dir=...
    assert _default_run_dir() in outputs  # README: plain `rlforge train`
    assert ".venv/" in outputs  # README: python3 -m venv .venv
    assert "rlforge.egg-info/" in outputs and ".pytest_cache/" in outputs
    assert command_outputs(shlex.split("rlforge export ckpt --out my-model")) == ["my-model/"]
    assert command_outputs(shlex.split("rlforge perf report runs/a")) == ["runs/a/report/"]
    assert command_outputs(shlex.split("rlforge data gsm8k --src DIR --out ~/data/gsm8k")) == []
    assert command_outputs(shlex.split("rlforge export CKPT --out DIR")) == []
    assert shell_commands("python - <<'PY'\nprint('--out x')\nPY\nls -o y  # --out z") == [
        ["python", "-"], ["ls", "-o", "y"]]


@pytest.mark.e2e  # runs git
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_documented_outputs_are_git_ignored() -> None:
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True)
    if inside.stdout.strip() != "true":
        pytest.skip(f"{ROOT} is not a git checkout")
    outputs = documented_outputs()
    # a folder is ignored when a file in it is (with the folder itself or a parent ignored); a file itself
    probes = {path: path + "any-file" if path.endswith("/") else path for path in outputs}
    res = subprocess.run(["git", "check-ignore", "--stdin", "-v", "-n"], cwd=ROOT, capture_output=True, text=True,
                         input="\n".join(probes.values()) + "\n", timeout=60)
    assert res.returncode in (0, 1), res.stderr
    not_ignored = {line.split("\t", 1)[1] for line in res.stdout.splitlines() if line.startswith("::\t")}
    missing = [f"{path} (from {'; '.join(outputs[path])})" for path, probe in probes.items() if probe in not_ignored]
    assert not missing, "documented commands write these untracked paths; git-ignore them or change the docs:\n" + \
        "\n".join(missing)
