"""The composition root of the ``rgpu`` command (typer), kept to argument parsing and printing;
each command's work lives in its own module. The operator's commands are this package's; the
proving ground's (``demo``, ``up --sim``, ``soak``, ...) join them when rgpu-sim is installed
(``proving_ground``)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from importlib.metadata import EntryPoint

import anyio
import httpx
import typer
from rich.console import Console

from rgpu_contracts import ContractError
from rgpu_placement import PlacementError
from rgpu_runtime.errors import RgpuError
from rgpu_runtime.settings import Settings

from .explain import explain, render_explanation
from .pool import cordon_command, drain_command, uncordon_command, usage_command
from .proving_ground import add_commands, offered
from .queue import fetch_queue, queue_json, render_queue
from .status_command import status

__all__ = ["app", "create_app", "main"]


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def queue_command(
    namespace: str | None = typer.Option(None, "--namespace", "-n", help="only this namespace"),
    output: str = typer.Option("table", "--output", "-o", help="table or json"),
    allocator_url: str = typer.Option(
        lambda: _env("RGPU_ALLOCATOR_URL", "http://127.0.0.1:8082"),
        help="allocator base URL (RGPU_ALLOCATOR_URL)",
    ),
) -> None:
    """Pods waiting for a remote GPU in admission order, and each namespace's share."""
    if output not in ("table", "json"):
        raise typer.BadParameter("expected table or json", param_hint="--output")
    console = Console()
    try:
        found = anyio.run(fetch_queue, allocator_url)
    except (httpx.HTTPError, ContractError) as exc:
        console.print(
            f"[red]cannot read the queue from {allocator_url}/v1/queue[/] ({exc}); "
            "set RGPU_ALLOCATOR_URL or --allocator-url to the allocator's address"
        )
        raise typer.Exit(code=2) from None
    if output == "json":
        print(queue_json(found, namespace=namespace))
    else:
        console.print(render_queue(found, namespace=namespace))


def explain_command(
    pod: str = typer.Argument(..., help="NAMESPACE/NAME of the pod"),
) -> None:
    """Why a pod is waiting: the allocator's dry-run decision with per-server reasons.

    Reads RGPU_KUBE_URL (else in-cluster, else KUBECONFIG), RGPU_ALLOCATOR_URL and the
    resource names from the environment, like the services do.
    """
    namespace, sep, name = pod.partition("/")
    if not (sep and namespace and name):
        raise typer.BadParameter("expected NAMESPACE/NAME, e.g. ml-team/trainer-0")
    console = Console()
    try:
        settings = Settings.from_env(os.environ, service="extender")
        explanation = anyio.run(explain, settings, namespace, name)
    except (RgpuError, PlacementError, httpx.HTTPError, ContractError) as exc:
        console.print(f"[red]cannot explain {pod}:[/] {exc}")
        raise typer.Exit(code=2) from None
    console.print(render_explanation(explanation))


def create_app(found: Iterable[EntryPoint]) -> typer.Typer:
    """The ``rgpu`` command: the operator's commands, then those ``found`` offers."""
    app = typer.Typer(
        add_completion=False, no_args_is_help=True, help="rgpu: remote GPUs for Kubernetes pods."
    )
    app.command()(status)
    app.command("queue")(queue_command)
    app.command("explain")(explain_command)
    # Running the pool (``pool``): maintenance and usage.
    app.command("cordon")(cordon_command)
    app.command("uncordon")(uncordon_command)
    app.command("drain")(drain_command)
    app.command("usage")(usage_command)
    add_commands(app, found)
    return app


app = create_app(offered())


def main() -> None:
    """Entry point of the ``rgpu`` console script."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # The commands report the apiserver's problems themselves, in one line each; the client
    # library's own warnings ("Config not found: ~/.kube/config") would only add noise.
    logging.getLogger("kubernetes_asyncio").setLevel(logging.ERROR)
    app()
