"""What the user reads: the start-of-run table of ``rlforge train`` and the tables of ``rlforge tune``.

Memory in GB (1e9 bytes, as ``perf/max_memory_allocated_gb``), times in seconds per step.  "predicted"
marks the memory and time models' numbers; "measured" the probes'.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlforge.tune.apply import default_levers, override_line
from rlforge.tune.levers import KEYS, LEVER_NAMES, Levers
from rlforge.tune.plan import Candidate, Plan, evaluate


def _v(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _gb(c: Candidate) -> str:
    return f"{c.peak_bytes / 1e9:.1f}" + ("" if c.fits else " (does not fit)")


def start_table(plan: Plan, before: Levers) -> str:
    """The short table printed after ``rlforge train``'s start line: one row per lever whose value the
    tuner changed, the user's kept levers named, the predicted peak and step time."""
    lev = plan.chosen.levers
    rows = [f"  {KEYS[n][0]:<52} {_v(getattr(before, n)):>8} -> {_v(getattr(lev, n))}"
            for n in LEVER_NAMES if getattr(lev, n) != getattr(before, n) and n not in plan.fixed]
    kept = ", ".join(KEYS[n][0].rsplit(".", 1)[1] for n in plan.fixed) or "none"
    head = (f"rlforge tune: {plan.device.name} | predicted peak {plan.chosen.peak_bytes / 1e9:.1f} GB "
            f"(stage {max(plan.chosen.memory.values(), key=lambda s: s.total).stage}), "
            f"{plan.chosen.time.total:.1f} s/step | yours, kept: {kept}")
    return "\n".join([head, *rows]) if rows else head + " | nothing to change"


def _lever_row(plan: Plan, name: str) -> list[str]:
    """lever | verl default | chosen | predicted peak GB with this lever at verl's default | gain."""
    lev, base = plan.chosen.levers, default_levers()
    chosen, default = getattr(lev, name), getattr(base, name)
    measured = plan.measured_s.get(lev)
    if chosen == default or plan.inputs is None:
        return [KEYS[name][0], _v(default), _v(chosen), "", f"{measured:.2f}" if measured else "-", "-"]
    alt = evaluate(plan.inputs, replace(lev, **{name: default}))
    gain = f"{alt.time.total / plan.chosen.time.total:.2f}x" if alt.fits else "default does not fit"
    return [KEYS[name][0], _v(default), _v(chosen), _gb(alt), f"{measured:.2f}" if measured else "-", gain]


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def tune_table(plan: Plan, free: Plan | None = None) -> str:
    """``rlforge tune``'s table (the tuning guide's shape), the totals, the user's keys and the override line."""
    header = ["lever", "verl default", "chosen", "predicted GB (this lever at default)", "measured s/step", "gain"]
    rows = [_lever_row(plan, n) for n in LEVER_NAMES]
    measured = plan.measured_s.get(plan.chosen.levers)
    rows.append(["**all levers**", "", "", f"{_gb(plan.default)} -> {_gb(plan.chosen)}",
                 f"{measured:.2f}" if measured else "-",
                 f"{plan.default.time.total / plan.chosen.time.total:.2f}x (predicted "
                 f"{plan.default.time.total:.1f} -> {plan.chosen.time.total:.1f} s/step)"])
    out = [f"rlforge tune: {plan.device.name}, {plan.workload.layout.describe()}, {plan.workload.rows} sequences of "
           f"up to {plan.workload.seq_len} tokens per GPU per step", "", _markdown(header, rows), "",
           "Predicted peak per stage (GB): " + ", ".join(
               f"{k} {v.total / 1e9:.1f}" for k, v in plan.chosen.memory.items())]
    out += _user_keys_lines(plan, free)
    line = override_line(plan.chosen.levers, default_levers())
    out += ["", "Paste (verl's keys):", f"  {line or '(verl defaults are already the choice)'}"]
    return "\n".join(out)


def _user_keys_lines(plan: Plan, free: Plan | None) -> list[str]:
    """For each lever the user set: what auto would choose and the predicted gain."""
    if not plan.fixed or free is None:
        return []
    out = ["", "Keys you set (kept):"]
    for name, value in plan.fixed.items():
        auto = getattr(free.chosen.levers, name)
        if auto == value:
            out.append(f"  {KEYS[name][0]}={_v(value)}: auto would choose the same")
        else:
            out.append(f"  {KEYS[name][0]}={_v(value)}: auto would choose {_v(auto)}; with every lever auto, predicted "
                       f"{plan.chosen.time.total / free.chosen.time.total:.2f}x faster "
                       f"({plan.chosen.time.total:.1f} -> {free.chosen.time.total:.1f} s/step)")
    return out


def layout_table(plans: list[tuple[str, Plan | str]]) -> str:
    """``rlforge tune --gpus N``: one row per layout, all "predicted" (no probe runs on GPUs not here)."""
    rows = []
    for name, p in plans:
        if isinstance(p, str):
            rows.append([name, "-", "-", p])
            continue
        rows.append([name, f"{p.chosen.peak_bytes / 1e9:.1f}", f"{p.chosen.time.total:.1f}",
                     override_line(p.chosen.levers, default_levers()) or "verl defaults"])
    return _markdown(["layout", "predicted peak GB per GPU", "predicted s/step", "levers"], rows)
