"""User-facing errors.

Every mistake a user can make (a bad config key, a missing file, a malformed row, a
broken custom reward function) raises a subclass of :class:`RLForgeError` whose message
names the key, file or row and says what to change.  The CLI prints that one message
and exits with status 2, without a traceback.  Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class RLForgeError(Exception):
    """Base class of errors caused by user input; the CLI prints only the message."""


class ConfigError(RLForgeError, ValueError):
    """A config key, value or combination of values is invalid."""


class DataError(RLForgeError, ValueError):
    """A data file is missing or unreadable, or a row is malformed."""


class ModelError(RLForgeError, ValueError):
    """A model path or preset cannot be loaded."""


class CheckpointError(RLForgeError, ValueError):
    """A folder is not a (complete) rlforge checkpoint, or its weights do not fit its model."""


class RewardError(RLForgeError, ValueError):
    """A reward function is missing, raises, or returns something that is not a number."""


class DeviceOutOfMemory(RLForgeError):
    """A stage ran out of accelerator memory; the message names the stage, the memory in use and
    the config keys that lower it (:mod:`rlforge.trainer.oom`).  The original error is ``__cause__``."""


class RLForgeWarning(UserWarning):
    """A warning rlforge prints to the user (``rlforge: warning: ...``): about a key the user set, or
    a value rlforge chose that changes what the run does.  The command line prints warnings of this
    category only; other libraries' warnings are shown under ``--verbose``
    (:mod:`rlforge.console_warnings`).  Every ``warnings.warn`` in rlforge passes this category or a
    subclass."""
