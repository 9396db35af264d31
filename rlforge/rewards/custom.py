"""Load a user's reward function from a ``.py`` file (``custom_reward_function.{path,name}``).

The function is called with keywords, as verl does:
``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`` and
returns a number, or a dict whose ``score`` is the reward and whose other keys are logged.
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

from rlforge.errors import RewardError
from rlforge.rewards.exits import USER_EXITS, SigintWatch, exit_error, exit_reason


def load_custom_reward_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Import ``path`` as a module and return its function ``name``.

    Raises:
        RewardError: the file is missing, fails to import (message carries the original
            error), or has no callable ``name``.
    """
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        raise RewardError(f"custom_reward_function.path={path!r}: file not found")
    module_name = "rlforge_custom_reward_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RewardError(f"custom_reward_function.path={path!r}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise RewardError(
            f"custom_reward_function.path={path!r} failed to import: {type(e).__name__}: {e}"
        ) from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise RewardError(
            f"custom_reward_function.name={name!r}: no function {name!r} in {path}; "
            "define it or set custom_reward_function.name"
        )
    return fn


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) or (hasattr(x, "item") and getattr(x, "ndim", 1) == 0)


def sample_where(fn_desc: str, index: int, data_source: str) -> str:
    """How errors name one sample: ``reward function <fn> on sample <i> (data_source=<ds>)``."""
    return f"reward function {fn_desc} on sample {index} (data_source={data_source!r})"


def check_result(out: Any, where: str) -> tuple[float, dict[str, Any]]:
    """Check what a reward function returned for one sample.

    Returns:
        ``(score, extras)``: the finite float score and a dict's other keys (empty for a number).

    Raises:
        RewardError: a non-number, NaN/inf (an int too large for a float included), or a dict without a numeric ``score``; the message
            starts with ``where`` (see :func:`sample_where`).
    """
    extras: dict[str, Any] = {}
    if isinstance(out, Mapping):
        if "score" not in out:
            raise RewardError(
                f"{where} returned a dict without a 'score' key (keys: {sorted(map(str, out))})"
            )
        extras = {str(k): v for k, v in out.items() if k != "score"}
        out = out["score"]
    if not _is_number(out):
        raise RewardError(f"{where} returned {type(out).__name__} {str(out)[:60]!r}, expected a number")
    try:
        score = float(out)
    except OverflowError:  # an int past float's range (10**400)
        score = math.inf
    if not math.isfinite(score):
        raise RewardError(f"{where} returned {score}, expected a finite number")
    return score, extras


def call_reward_fn(
    fn: Callable[..., Any],
    fn_desc: str,
    index: int,
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None,
) -> tuple[float, dict[str, Any]]:
    """Call a reward function on one sample in this process and check what it returns.

    Returns:
        ``(score, extras)`` as :func:`check_result`.

    Raises:
        RewardError: the function raised (``sys.exit`` and a ``KeyboardInterrupt`` raised by the
            function included; a real Ctrl-C is re-raised as it is), or returned a bad value; the
            message names the sample ``index``, ``data_source`` and ``fn_desc`` (and the original
            exception's message).
    """
    where = sample_where(fn_desc, index, data_source)
    with SigintWatch() as sigint:
        try:
            out = fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                     extra_info=extra_info)
        except Exception as e:
            raise RewardError(f"{where} raised {type(e).__name__}: {e}") from e
        except USER_EXITS as e:
            if not sigint.is_user_exit(e):
                raise
            raise exit_error(where, exit_reason(e)) from e
    return check_result(out, where)
