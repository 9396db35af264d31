"""``rlforge tune``: plan (and on a GPU with ``--probe``, measure) the levers without training.

    rlforge tune [--config-path DIR --config-name NAME] [--config FILE] [--job NAME|none] [key=value ...]
                 [--gpus N [--nnodes M]] [--device h100|h200|cpu] [--device-memory-gb X] [--probe]
    rlforge tune --check-memory RUN_DIR [--device ...]

Prints the tuning guide's table (lever | verl default | chosen | predicted memory | measured step time |
gain), what auto would choose for the keys you set, and the override line to paste.  ``--gpus N``
plans layouts for N GPUs from the model alone ("predicted").  ``--check-memory`` compares the memory
model with a finished run's ``perf/max_memory_allocated_gb/<stage>``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from rlforge.errors import ConfigError
from rlforge.tune.device import SPECS, DeviceSpec, detect, fake_device


def add_tune_parser(sub: Any) -> None:
    """The ``tune`` sub-command's arguments on ``sub`` (argparse sub-parsers)."""
    t = sub.add_parser("tune", help="choose the speed levers (auto values) without training",
                       description="Plan the levers that do not change what is learned (token budgets, "
                       "checkpointing, offload, liger, reshard, rollout memory) for this model, workload and GPU.")
    t.add_argument("--config-path", "-cp", dest="config_path", default=None, metavar="DIR")
    t.add_argument("--config-name", "-cn", dest="config_name", default=None, metavar="NAME")
    t.add_argument("--config", dest="config_file", default=None, help="YAML file of config values")
    t.add_argument("--job", default=None, help="embedded job to start from (as rlforge train)")
    t.add_argument("--gpus", type=int, default=None, help="plan layouts for N GPUs in all (predicted)")
    t.add_argument("--nnodes", type=int, default=None, help="nodes the --gpus are spread over")
    t.add_argument("--device", default=None, help="plan for this device instead of the visible one: "
                   + ", ".join(k.lower() for k in SPECS))
    t.add_argument("--device-memory-gb", type=float, default=None, help="plan for a device of this memory")
    t.add_argument("--probe", action="store_true", help="on a GPU, build the job once and measure the best "
                   "candidates' update (a few forward+backward passes each, synthetic tokens)")
    t.add_argument("--check-memory", default=None, metavar="RUN_DIR",
                   help="compare the memory model with RUN_DIR/metrics.jsonl")
    t.add_argument("overrides", nargs="*", help="key=value overrides (as rlforge train)")


def check_args(args: argparse.Namespace) -> None:
    """One error line for a ``--gpus``, ``--nnodes``, ``--device-memory-gb`` or ``--check-memory`` that
    cannot mean anything (before a config is read)."""
    import math
    from pathlib import Path

    if args.gpus is not None and args.gpus < 1:
        raise ConfigError(f"--gpus {args.gpus}: must be a number of GPUs >= 1")
    if args.nnodes is not None:
        if args.gpus is None:
            raise ConfigError(f"--nnodes {args.nnodes}: spreads --gpus over nodes; give --gpus N too")
        if args.nnodes < 1 or args.gpus % args.nnodes:
            raise ConfigError(f"--nnodes {args.nnodes}: must be >= 1 and divide --gpus {args.gpus} "
                              "(the same number of GPUs on every node)")
    mem = args.device_memory_gb
    if mem is not None and not (math.isfinite(mem) and mem > 0):
        raise ConfigError(f"--device-memory-gb {mem}: must be a memory size in GB > 0")
    if args.check_memory and not (Path(args.check_memory) / "run_config.yaml").is_file():
        raise ConfigError(f"--check-memory {args.check_memory}: no run_config.yaml there (give the folder of a "
                          "finished run, its trainer.default_local_dir)")


def pick_device(name: str | None, memory_gb: float | None) -> DeviceSpec:
    """``--device`` / ``--device-memory-gb``, else the visible device."""
    if name is not None:
        key = name.upper() if name.lower() != "cpu" else "cpu"
        if key not in SPECS:
            raise ConfigError(f"--device {name}: unknown; known: {', '.join(k.lower() for k in SPECS)}")
        dev = SPECS[key]
    else:
        dev = fake_device(memory_gb) if memory_gb is not None else detect()
    return replace(dev, memory_bytes=memory_gb * 1e9) if memory_gb is not None else dev


def _layouts(gpus: int, nnodes: int, shape: Any = None) -> list[tuple[int, int]]:
    """(tp, pp) pairs for ``gpus`` GPUs: TP within a node (at most 8), PP over the rest; with ``shape``
    (:class:`rlforge.tune.shapes.ModelShape`), only a TP that divides the attention and KV heads and the
    MLP width, and a PP that divides the layers (as the Megatron engine requires)."""
    per_node = max(1, gpus // max(1, nnodes))
    out = [(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4) if tp <= per_node and gpus % (tp * pp) == 0]
    if shape is not None:
        out = [(tp, pp) for tp, pp in out if not (shape.heads % tp or shape.kv_heads % tp
                                                  or shape.intermediate % tp or shape.layers % pp)]
    return out


def rollout_tp_for(shape: Any, dev: DeviceSpec, per_node: int, configured: int = 1) -> int:
    """``rollout.tensor_model_parallel_size`` for ``rlforge tune --gpus``: the configured one where it is above 1,
    else the smallest of 1, 2, 4, 8 (within a node, dividing the attention heads) whose slice of the bf16 rollout
    weights and the engine's packed copies take at most half the device, leaving the rest to the KV cache."""
    if configured > 1:
        return configured
    fits = [t for t in (1, 2, 4, 8) if t <= per_node and not shape.heads % t]
    return next((t for t in fits if 2.0 * (shape.params + shape.packed_params) / t <= 0.5 * dev.memory_bytes),
                fits[-1] if fits else 1)


def run_layouts(cfg: Any, dev: DeviceSpec, gpus: int, nnodes: int) -> str:
    """The ``--gpus`` table: each layout's plan, all predicted."""
    from rlforge.tune.apply import default_levers, fixed_levers
    from rlforge.tune.plan import Plan, choose
    from rlforge.tune.report import layout_table
    from rlforge.tune.shapes import model_shape
    from rlforge.tune.tuner import inputs_for
    from rlforge.tune.workload import Layout, users_rollout_tp

    plans: list[tuple[str, Plan | str]] = []
    shape = model_shape(str(cfg.actor_rollout_ref.model.path))
    rtp = rollout_tp_for(shape, dev, max(1, gpus // max(1, nnodes)), users_rollout_tp(cfg, gpus))
    for tp, pp in _layouts(gpus, nnodes, shape):
        lay = Layout(gpus, tp, pp, gpus // (tp * pp), nnodes, rtp)
        inp = inputs_for(cfg, dev, lay)
        if tp * pp > 1:
            inp = replace(inp, workload=replace(inp.workload, strategy="megatron"))
        name = (f"FSDP {lay.fsdp} x TP {tp} x PP {pp}" + (" (strategy=megatron)" if tp * pp > 1 else "")
                + (f", rollout TP {rtp}" if rtp > 1 else ""))
        try:
            plans.append((name, choose(inp, fixed_levers(cfg), default_levers())))
        except ConfigError as e:
            plans.append((name, f"does not fit: {e}"))
    head = f"rlforge tune: predicted for {gpus} x {dev.name} over {nnodes} node(s), from the model alone (no probes)"
    return head + "\n\n" + layout_table(plans)


def run_tune(args: argparse.Namespace) -> int:
    """``rlforge tune``: print the plan (module doc); returns the exit status."""
    from rlforge.config import load_config, validate_config

    check_args(args)
    dev = pick_device(args.device, args.device_memory_gb)
    if args.check_memory:
        from pathlib import Path

        from rlforge.tune.memcheck import compare, markdown, measured_peaks
        from rlforge.tune.tuner import plan_config

        run = Path(args.check_memory)
        cfg = load_config([], config_file=str(run / "run_config.yaml"), job=None)
        plan = plan_config(cfg, dev)  # every key is the run's: the plan evaluates exactly its levers
        print(markdown(compare(plan.chosen.memory, measured_peaks(run / "metrics.jsonl"))))
        return 0
    hydra = args.config_path is not None or args.config_name is not None
    job = args.job if args.job is not None else (None if hydra else "default")
    cfg = load_config(list(args.overrides), config_file=args.config_file, job=None if job in ("none", "") else job,
                      config_path=args.config_path, config_name=args.config_name)
    validate_config(cfg)
    if args.gpus is not None:
        if dev.is_cpu:
            raise ConfigError(f"--gpus {args.gpus} plans GPUs, and this machine has none: add --device "
                              "h100|h200|a100 or --device-memory-gb X")
        print(run_layouts(cfg, dev, args.gpus, args.nnodes or 1))
        return 0
    from rlforge.tune.report import tune_table
    from rlforge.tune.tuner import plan_config

    if args.probe and detect().is_cpu:  # asked for, so never passed over in silence
        raise ConfigError("--probe measures on this machine's GPU, and it has none (plan without --probe)")
    if dev.is_cpu:
        print("rlforge tune: cpu: levers stay as configured on a CPU; plan for a GPU with --device h100|h200")
        return 0
    if args.probe:
        from rlforge.tune.bench import measured_device

        dev = measured_device(dev)
    plan, free = plan_config(cfg, dev), plan_config(cfg, dev, free=True)
    if args.probe:
        from rlforge.tune.inprocess import probe_for_tune

        probe_for_tune(cfg, plan)
    print(tune_table(plan, free))
    return 0
