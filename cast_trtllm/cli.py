"""The `cast-trtllm` command line.

`cast_trtllm` must not import the runtime, engines or GPUs, so each subcommand is named
here by the module that owns it and imported only when that subcommand runs.
"""

from __future__ import annotations

import importlib

import click

# command name -> "module:attribute" of a click.Command in the package that owns it
COMMANDS: dict[str, str] = {
    "generate": "runtime.cli:generate",
    "probe": "engine_builder.probe:probe",
    "build": "engine_builder.cli:build",
    "sweep": "perf.cli:sweep",
    "bench": "perf.cli:bench",
    "prepare-dataset": "perf.cli:prepare_dataset",
    "triton-repo": "runtime.serving.cli:triton_repo",
    "serve": "runtime.serving.cli:serve",
    "train-drafter": "drafter_builder.cli:train_drafter",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            raise click.ClickException(
                f"command '{name}' is not available: {err}. Reinstall cast-trtllm "
                "with `pip install -e .[dev]`."
            ) from err
        return getattr(module, attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cast-trtllm")
def main() -> None:
    """CAST: cost-aware speculative trees over a DFlash block drafter."""
