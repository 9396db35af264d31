"""``trainer.logger=console``: one readable line per step, with the main metrics first."""

from __future__ import annotations

import sys
from typing import TextIO

_HEADLINE = [
    "critic/score/mean", "val-core/", "reward/model_score/mean", "reward/judge_parse_failure_rate",
    "multi_turn/tool_calls/mean", "multi_turn/tool/", "multi_turn/truncated_ratio", "actor/pg_loss",
    "actor/kl_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss", "response_length/mean", "timing_s/step",
    "perf/gpu_util/mean", "perf/idle_ratio", "train/loss", "val/loss", "train/grad_norm",
]
"""Key prefixes shown on the step line, in this order: the score, validation, the reward model's or
judge's score and failed parses (``reward_model.*``), tool use (``multi_turn/*``: calls per sample,
each tool's errors and timeouts when there are any), the losses, lengths and time; the SFT
trainer's loss and gradient norm."""
_TOOL_COUNTS = ("/error", "/timeout")
"""``multi_turn/tool/<name>/*`` counts on the step line when not 0 (all of them: ``trainer.logger=file``)."""


def _fmt(v: float) -> str:
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e9):
        return str(int(v))
    return f"{v:.4g}"


class ConsoleLogger:
    """Prints ``step N | key: value | ...`` with headline metrics first; ``verbose``
    prints every metric on following lines."""

    def __init__(self, stream: TextIO | None = None, verbose: bool = False) -> None:
        self.stream = stream or sys.stdout
        self.verbose = verbose

    def log(self, metrics: dict[str, float], step: int) -> None:
        head = [(k, v) for p in _HEADLINE for k, v in sorted(metrics.items()) if k.startswith(p)
                and (p != "multi_turn/tool/" or (k.endswith(_TOOL_COUNTS) and v))]
        parts = [f"step {step}"] + [f"{k}: {_fmt(v)}" for k, v in head]
        print(" | ".join(parts), file=self.stream, flush=True)
        if self.verbose:
            for k in sorted(metrics):
                print(f"    {k}: {_fmt(metrics[k])}", file=self.stream)

    def close(self) -> None:
        pass
