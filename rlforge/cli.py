"""``rlforge`` command line: thin parsing and dispatch.

    rlforge train [--config-path DIR --config-name NAME] [--config FILE] [--job NAME|none] [--print-config]
                  [--verbose] [key=value | --key=value | +key=value | ++key=value | ~key ...]
    rlforge check-config [--config-path DIR --config-name NAME] [--config FILE] [key=value ...]
                  (per key: takes effect / mapped -> KEY / warned (why); exit 2 on a refused key or value)
    rlforge sft [--config FILE] [--print-config] [key=value ...]   (verl's SFT keys: docs/sft.md)
    rlforge data gsm8k [--src DIR] [--out DIR]
    rlforge perf report RUN_DIR [--out DIR]
    rlforge perf trace FILE [--gaps K] [--top K] [--min-gap-ms X]
    rlforge export CHECKPOINT --out HF_DIR [--dtype D] [--model-path P] [--tokenizer-path P]
    rlforge launch --rdzv-endpoint HOST:PORT | --slurm [--max-restarts K] [train's flags and overrides]
                 (one node's ranks of a trainer.nnodes run, or its sbatch script: docs/multinode.md)
    rlforge tune [train's config flags and overrides] [--gpus N [--nnodes M]] [--device D] [--probe]
                 [--check-memory RUN_DIR]   (docs/tuning.md)

``rlforge train`` layers the config as: schema defaults (verl's) <- the embedded job
(``default`` unless ``--job``, or none with ``--config-path/--config-name``) <- Hydra's
``--config-path DIR --config-name NAME`` (verl's ``ppo_trainer``/``ppo_megatron_trainer`` built in;
:mod:`rlforge.config.hydra_compose`) <- ``--config FILE`` <- overrides.  An override may also be
written as a flag, as verl's tuning guide does (``--a.b=value``, ``--a.b value``:
:mod:`rlforge.cli_args`).  A user mistake prints one ``rlforge: error: ...`` line and exits
with status 2.  A run prints one start line and, at the end, a summary
(:mod:`rlforge.trainer.summary`); warnings are rlforge's own, once each (other libraries' with
``--verbose``: :mod:`rlforge.console_warnings`).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Sequence

from rlforge.errors import RLForgeError


def _library_environment() -> None:
    """Environment the Hugging Face libraries read at import: set before any of them loads.  Output to a
    file or pipe gets no progress bars: tqdm reads ``TQDM_DISABLE`` for every bar, also those that libraries
    draw with tqdm directly (transformers' GGUF conversion) or before rlforge can quiet them."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not sys.stderr.isatty():
        os.environ.setdefault("TQDM_DISABLE", "1")


def _quiet_libraries() -> None:
    """transformers' own logging and progress bars off.  Called once the config is checked:
    importing transformers imports torch (seconds on a busy machine), which a config error need not wait for."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


class _LogFormat(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"rlforge: {record.levelname.lower()}: {record.getMessage()}"


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (it may be replaced after start-up)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _route_logs() -> None:
    """rlforge's own log records (``logging.getLogger("rlforge.*")``) as ``rlforge: warning: ...`` lines on
    stderr, like every other warning of the command."""
    log = logging.getLogger("rlforge")
    if not any(isinstance(h.formatter, _LogFormat) for h in log.handlers):
        handler = _Stderr(sys.stderr)
        handler.setFormatter(_LogFormat())
        log.addHandler(handler)
    log.setLevel(logging.WARNING)  # records still propagate: a root handler (pytest's caplog, a user's) sees them


def _print(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:  # e.g. `rlforge train --print-config | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _count(value: str) -> int:
    if not (value.isascii() and value.isdigit()):
        raise argparse.ArgumentTypeError(f"{value!r} is not a count (a whole number >= 0)")
    return int(value)


def _milliseconds(value: str) -> float:
    try:
        ms = float(value)
    except ValueError:
        ms = math.nan
    if not (math.isfinite(ms) and ms >= 0):
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration (a finite number of ms >= 0)")
    return ms


def run_train(overrides: Sequence[str], config_file: str | None, job: str | None, print_config: bool,
              started: float | None = None, config_path: str | None = None, config_name: str | None = None) -> int:
    """Load, validate and run (or print) a training job; returns the exit status.  ``started``
    (``time.time()`` at the command's start; default now) starts the summary's elapsed time;
    ``config_path``/``config_name`` are Hydra's flags (:func:`rlforge.config.load_config`)."""
    from rlforge.config import effective_loggers, format_config, load_config, validate_config
    from rlforge.console_warnings import show_config_warnings

    cfg = load_config(list(overrides), config_file=config_file, job=job, config_path=config_path,
                      config_name=config_name)
    show_config_warnings(validate_config(cfg))  # once, by the user's process
    if print_config:
        _print(format_config(cfg))
        return 0
    from rlforge.config.data_files import check_data_files

    check_data_files(cfg)  # a missing file in a second, not after torch and the model load
    _quiet_libraries()
    from rlforge.launch import maybe_launch
    from rlforge.trainer.cpu_threads import apply_cpu_threads
    from rlforge.trainer.summary import announce_start, launching, print_summary

    threads = apply_cpu_threads(cfg)  # a CPU run: torch's threads from the cores it may use
    started = announce_start(cfg, time.time() if started is None else started, threads)
    tuned = _tune(cfg)
    hydra = [*(["--config-path", config_path] if config_path is not None else []),
             *(["--config-name", config_name] if config_name is not None else [])]
    argv = ["--job", job or "none", *hydra, *(["--config", config_file] if config_file else []), *overrides,
            *tuned]
    with launching(started, threads):
        launched = maybe_launch(cfg, argv)
    if launched is not None:
        return launched
    from rlforge.engine.distributed import finish_launched_worker
    from rlforge.trainer.ppo_trainer import PPOTrainer

    loggers = effective_loggers(cfg)
    trainer = PPOTrainer(cfg, loggers)
    trainer.fit()
    print_summary(cfg, loggers, started, trainer)
    finish_launched_worker()
    return 0


def run_check_config(args: argparse.Namespace) -> int:
    """``rlforge check-config``: one line per key the user set (:mod:`rlforge.config.check`), then the
    warnings that name none of them; 0, or a :class:`~rlforge.errors.ConfigError` (exit 2 in :func:`main`)."""
    from rlforge.config.check import VERDICTS, check_config

    job = None if args.job in (None, "none", "") else args.job
    report = check_config(args.overrides, config_file=args.config_file, job=job, config_path=args.config_path,
                          config_name=args.config_name)
    for verdict in report.keys:
        _print(verdict.line())
    for line in report.other_warnings:
        _print(f"(other) warned: {line}")
    counts = {v: sum(k.verdict == v for k in report.keys) for v in VERDICTS}
    _print(f"{len(report.keys)} keys: " + ", ".join(f"{n} {v}" for v, n in counts.items()) + "; none refused")
    return 0


def _tune(cfg: object) -> list[str]:
    """The free levers chosen for this machine (:func:`rlforge.tune.tuner.tune_at_start`), once, by the
    user's process (launched workers get them as overrides); nothing for a launched worker."""
    from rlforge.launch import under_launcher
    from rlforge.trainer.builders.engines import pick_device
    from rlforge.trainer.summary import START_ENV
    from rlforge.tune.device import SPECS, detect
    from rlforge.tune.tuner import tune_at_start

    if under_launcher() and os.environ.get(START_ENV):  # a launched worker: the launching process tuned
        return []
    on_cpu = pick_device(cfg.trainer.device).type == "cpu"  # type: ignore[attr-defined]
    return tune_at_start(cfg, SPECS["cpu"] if on_cpu else detect(), out=_print)


_OVERRIDE_COMMANDS = ("train", "sft", "check-config", "tune", "launch")
"""Commands that take ``key=value`` overrides (also after their flags)."""


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlforge", description="RL post-training of LLMs (verl-compatible config).")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run an RL training job", description="Run an RL training job. "
                       "Overrides use verl's keys: a.b.c=value (or --a.b.c=value, --a.b.c value), +a.b=value, "
                       "++a.b=value, ~a.b (back to the default), trainer.logger=[console,file].")
    t.add_argument("--config-path", "-cp", dest="config_path", default=None, metavar="DIR",
                   help="Hydra's config folder (from the current directory); verl's `config` is built in")
    t.add_argument("--config-name", "-cn", dest="config_name", default=None, metavar="NAME",
                   help="Hydra config in --config-path (its defaults: list resolved); built in: verl's "
                   "ppo_trainer, ppo_megatron_trainer")
    t.add_argument("--config", dest="config_file", default=None, help="YAML file of config values")
    t.add_argument("--job", default=None, help="embedded job to start from ('none' = verl defaults only; "
                   "default: 'default', or none with --config-path/--config-name)")
    t.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    t.add_argument("--verbose", action="store_true", help="also show other libraries' warnings (torch, "
                   "transformers, peft: once each) and the profiler's log lines")
    t.add_argument("overrides", nargs="*", help="key=value overrides (also --key=value)")
    c = sub.add_parser("check-config", help="what rlforge does with each key of a verl command line",
                       description="Load and validate the config as `python -m rlforge.trainer.main_ppo "
                       "--print-config` does (verl's defaults, no embedded job; no torch), then print, per key "
                       "you set: takes effect / mapped -> KEY / warned (why). Exit 0, or 2 with one line when a "
                       "key or value is refused.")
    c.add_argument("--config-path", "-cp", dest="config_path", default=None, metavar="DIR",
                   help="Hydra's config folder, as for train")
    c.add_argument("--config-name", "-cn", dest="config_name", default=None, metavar="NAME",
                   help="Hydra config in --config-path, as for train")
    c.add_argument("--config", dest="config_file", default=None, help="YAML file of config values")
    c.add_argument("--job", default=None, help="embedded job to start from (default: none, as main_ppo)")
    c.add_argument("overrides", nargs="*", help="key=value overrides, as for train")
    from rlforge.trainer.sft_args import add_sft_arguments

    add_sft_arguments(sub.add_parser("sft", help="supervised fine-tuning (verl's SFT keys)",
                                     description="Supervised fine-tuning with verl's SFT trainer keys (docs/sft.md)."))
    d = sub.add_parser("data", help="prepare datasets")
    dsub = d.add_subparsers(dest="dataset", required=True)
    g = dsub.add_parser("gsm8k", help="GSM8K as verl-format parquet (fetched with `datasets`, or from --src)",
                        description="Write GSM8K's train.parquet and test.parquet in verl's row format, as verl's "
                        "examples/data_preprocess/gsm8k.py does. Without --src, openai/gsm8k is fetched through "
                        "the `datasets` package (pip install datasets).")
    g.add_argument("--src", "--local_dataset_path", dest="src", default=None,
                   help="a local copy instead of the Hub: a folder with the official train.jsonl and test.jsonl, "
                   "their parquet, or a `datasets` save")
    g.add_argument("--out", "--local_save_dir", dest="out", default="~/data/gsm8k",
                   help="output folder for train.parquet and test.parquet (default: ~/data/gsm8k, as verl)")
    pf = sub.add_parser("perf", help="performance tools")
    psub = pf.add_subparsers(dest="perf_command", required=True)
    r = psub.add_parser("report", help="stage times, GPU utilisation and training curves of a run",
                        description="Write report.md and PNG plots from RUN_DIR/metrics.jsonl and RUN_DIR/trace/.")
    r.add_argument("run_dir", help="the run's trainer.default_local_dir")
    r.add_argument("--out", default=None, help="output folder (default: RUN_DIR/report)")
    tr = psub.add_parser("trace", help="where the GPU sat idle in a torch.profiler trace, and why",
                         description="Print GPU busy/idle totals, the longest idle gaps with the CPU ops and "
                         "CUDA calls running during them, and the top kernels of a torch.profiler Chrome trace "
                         "(RUN_DIR/trace/torch_rank<R>_step<N>.json from trainer.profile_steps, or .json.gz).")
    tr.add_argument("file", help="the trace file")
    tr.add_argument("--gaps", type=_count, metavar="K", default=10, help="longest gaps to show (default 10)")
    tr.add_argument("--top", type=_count, metavar="K", default=15, help="kernels to show (default 15)")
    tr.add_argument("--min-gap-ms", type=_milliseconds, metavar="X", default=0.0,
                    help="ignore gaps shorter than X ms (default 0)")
    from rlforge.multinode import add_launch_parser
    from rlforge.trainer.export import add_export_parser
    from rlforge.tune.cli import add_tune_parser

    add_export_parser(sub)
    add_tune_parser(sub)
    add_launch_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlforge`` console script."""
    from rlforge.cli_args import UsageError, article_overrides, is_override, unknown_flag_message

    started = time.time()
    parser = _build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] in (["train"], ["check-config"], ["tune"]):  # `--a.b=value` / `--a.b value` -> `a.b=value`
            argv = [argv[0], *article_overrides(argv[1:])]
        args, extra = parser.parse_known_args(argv)
        # overrides may also come after flags: `rlforge train a=1 --print-config b=2`
        if args.command in _OVERRIDE_COMMANDS and extra and not all(is_override(x) for x in extra):
            raise UsageError(unknown_flag_message(extra, args.command))
    except UsageError as e:
        print(f"rlforge: error: {e}", file=sys.stderr, flush=True)
        return 2
    if args.command in _OVERRIDE_COMMANDS:
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from rlforge.console_warnings import install

    install(verbose=bool(getattr(args, "verbose", False)))  # rlforge's warnings once; libraries' with --verbose
    _route_logs()
    if args.command != "perf":  # the perf tools need neither torch's nor transformers' start-up
        _library_environment()
    if args.command == "export":  # train quiets them once its config is checked (run_train); data needs no torch
        _quiet_libraries()
    try:
        if args.command == "check-config":
            return run_check_config(args)
        if args.command == "train":
            hydra = args.config_path is not None or args.config_name is not None
            job = args.job if args.job is not None else (None if hydra else "default")
            job = None if job in ("none", "") else job
            return run_train(args.overrides, args.config_file, job, args.print_config, started,
                             args.config_path, args.config_name)
        if args.command == "launch":
            from rlforge.multinode import run_launch

            return run_launch(args)
        if args.command == "tune":
            from rlforge.tune.cli import run_tune

            return run_tune(args)
        if args.command == "sft":
            from rlforge.trainer.sft_trainer import run_sft

            return run_sft(args.overrides, args.config_file, args.print_config)
        if args.command == "data":
            from rlforge.data.gsm8k import convert_gsm8k

            counts = convert_gsm8k(args.src, args.out)
            for split, n in counts.items():
                print(f"wrote {n} rows to {os.path.join(os.path.expanduser(args.out), split + '.parquet')}")
            return 0
        if args.command == "perf" and args.perf_command == "trace":
            from rlforge.perf.torch_trace import render_markdown, summarize

            _print(render_markdown(summarize(args.file, args.gaps, args.top, args.min_gap_ms)))
            return 0
        if args.command == "perf":
            from rlforge.perf.report import write_report

            path = write_report(args.run_dir, args.out)
            print(f"wrote {path} and its plots")
            return 0
        if args.command == "export":
            from rlforge.trainer.export import run_export

            return run_export(args)
    except RLForgeError as e:
        from rlforge.launch import report_user_error

        report_user_error(str(e))  # under a launcher: once, from rank 0
        return 2
    except KeyboardInterrupt:
        print("rlforge: interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
