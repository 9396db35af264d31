"""One registry mechanism for every pluggable variant.

Advantage estimators, policy losses, KL estimators, reward rules, rollout backends and
training engines are each a :class:`Registry`.  A registry rejects duplicate names and,
when asked for an unknown name, lists the valid ones (and the closest match), so the
caller never branches on a key.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from rlforge.errors import ConfigError

T = TypeVar("T")


def unknown_name(kind: str, config_key: str, name: object, valid: Iterable[str]) -> ConfigError:
    """The error for ``name`` missing from a table of ``kind`` entries selected by ``config_key``:
    it names the key, the closest valid name and every valid name (what :meth:`Registry.get` raises)."""
    valid = sorted(valid)
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    where = f" ({config_key})" if config_key else ""
    return ConfigError(f"unknown {kind} {name!r}{where}.{hint} Valid names: {', '.join(valid)}")


class Registry(Generic[T]):
    """A named table of interchangeable implementations.

    Args:
        kind: what the entries are, used in error messages (e.g. ``"advantage estimator"``).
        config_key: the config key that selects an entry (e.g. ``"algorithm.adv_estimator"``),
            named in the error for an unknown entry.
    """

    def __init__(self, kind: str, config_key: str = "") -> None:
        self.kind = kind
        self.config_key = config_key
        self._entries: dict[str, T] = {}

    def register(self, *names: str) -> Callable[[T], T]:
        """Decorator registering the object under one or more names (aliases).

        Raises:
            ValueError: if a name is already registered.
        """

        def deco(obj: T) -> T:
            for name in names:
                if name in self._entries:
                    raise ValueError(f"{self.kind} {name!r} is already registered")
                self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """Return the entry called ``name``.

        Raises:
            ConfigError: if ``name`` is unknown; the message lists the valid names.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise unknown_name(self.kind, self.config_key, name, self._entries) from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        """Sorted list of registered names."""
        return sorted(self._entries)
