"""``rlforge train`` arguments: config keys written as flags, as verl's tuning guide writes them.

    --actor_rollout_ref.actor.use_dynamic_bsz=True --actor_rollout_ref.actor.strategy="fsdp2"
    --trainer.test_freq -1

become the overrides ``actor_rollout_ref.actor.use_dynamic_bsz=True``,
``actor_rollout_ref.actor.strategy="fsdp2"`` and ``trainer.test_freq=-1``.  The values are read
as for ``a.b=value`` (YAML: ``True``/``False``, and ``"fsdp2"`` with its quotes literally in
argv is the string fsdp2).  A flag whose name has a dot is a config key; rlforge's own flags
(``--config``, ``--job``, ``--print-config``, ``--verbose``, ``--help``) have none and are left alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlforge.errors import RLForgeError

TRAIN_FLAGS = ("--config", "--job", "--print-config", "--config-path", "--config-name", "--verbose", "--help", "-h")
"""``rlforge train``'s own flags, as the error for an unknown flag lists them."""

_FLAGS_WITH_VALUE = ("--config", "--job", "--config-path", "--config-name", "-cp", "-cn")


class UsageError(RLForgeError):
    """A command line that cannot be read; printed as one ``rlforge: error:`` line (exit 2)."""


def _is_value(token: str) -> bool:
    """A token that may follow ``--a.b`` as its value: not a flag (a negative number is a value)
    and not an override of its own (``c.d=1``)."""
    if token.startswith("-") and not (token[1:2].isdigit() or token[1:2] == "."):
        return False
    key, sep, _ = token.partition("=")
    return not (sep and "." in key)


def article_overrides(tokens: Sequence[str]) -> list[str]:
    """``tokens`` (the arguments after ``train``) with ``--a.b=value`` and ``--a.b value``
    turned into ``a.b=value``; everything else unchanged, in order.

    Raises:
        UsageError: ``--a.b`` with no value after it (the last argument, or followed by a flag or
            by another override); the message shows the accepted forms.
    """
    out: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        name, sep, value = tok.partition("=")
        if tok in _FLAGS_WITH_VALUE and i + 1 < len(tokens):  # `--config my.yaml`: the path is no key
            out += [tok, tokens[i + 1]]
            i += 2
            continue
        if tok.startswith("--") and "." in name:
            key = name[2:]
            if sep:
                out.append(f"{key}={value}")
            elif i + 1 < len(tokens) and _is_value(tokens[i + 1]):
                out.append(f"{key}={tokens[i + 1]}")
                i += 1
            else:
                raise UsageError(f"{tok} needs a value: write {tok}=VALUE or {key}=VALUE")
        else:
            out.append(tok)
        i += 1
    return out


def is_override(token: str) -> bool:
    """Whether ``token`` is a config override: ``key=value``, ``+key=value``, ``++key=value``,
    ``~key`` or ``~key=value`` (not a flag)."""
    return not token.startswith("-") and ("=" in token or token.startswith("~"))


def unknown_flag_message(extra: Sequence[str], command: str = "train") -> str:
    """The one-line error for arguments of ``rlforge <command>`` that argparse did not take (``rlforge
    <command> --help`` lists its flags)."""
    bad = next((x for x in extra if not is_override(x)), extra[0])
    flags = f"{', '.join(TRAIN_FLAGS[:5])}" if command == "train" else f"the flags of `rlforge {command} --help`"
    return (f"unrecognized argument {bad!r}; rlforge {command} takes {flags} and config "
            "overrides key=value or --key=value, +key=value, ~key (e.g. trainer.total_training_steps=2)")
