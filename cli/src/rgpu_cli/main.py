"""The composition root of the ``rgpu`` command (typer), kept to
argument parsing and printing; each command's work lives in its own module."""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx
import typer
from rich.console import Console

from rgpu_contracts import ContractError
from rgpu_placement import PlacementError
from rgpu_runtime.errors import RgpuError
from rgpu_runtime.settings import Settings

from .demo import DemoOptions, DemoReport, print_report, run_demo
from .explain import explain, render_explanation
from .pool import cordon_command, drain_command, uncordon_command, usage_command
from .processes import die_with_parent, run_until_stopped
from .queue import fetch_queue, queue_json, render_queue
from .simulate_command import simulate_command
from .soak import SoakOptions, SoakReport, plan_for, print_soak_report, run_soak
from .soak_plan import SoakPlan
from .soak_sizing import LOAD
from .soak_workload import WorkloadShape
from .stack import StackOptions, loop_options
from .status_command import status
from .timeline import timeline_svg
from .trace import SPANS_VARIABLE, trace_pod
from .up_command import down, env, up

__all__ = ["app", "main"]

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="rgpu: remote GPUs for Kubernetes pods."
)


def _granularity(value: str) -> str:
    if value not in ("server", "card"):
        raise typer.BadParameter("must be 'server' or 'card'")
    return value


def _new_file(value: Path | None) -> Path | None:
    # Checked before the run: a demo or soak takes minutes, and writes this file at the end.
    if value is not None and not value.parent.is_dir():
        raise typer.BadParameter(
            f"{value.parent} is not a directory: create it, or name a file in one that exists"
        )
    return value


@app.command()
def demo(
    servers: int = typer.Option(6, min=1, help="lupine servers to simulate"),
    cards: int = typer.Option(4, min=1, help="GPUs per server"),
    clients: int = typer.Option(12, min=1, help="GPU-less client nodes"),
    pods: int = typer.Option(60, min=1, help="pods in the workload"),
    granularity: str = typer.Option("server", callback=_granularity, help="server | card"),
    seed: int = typer.Option(1, help="seed for the fleet and the workload"),
    work_dir: Path | None = typer.Option(None, help="keep service logs here"),
    timeline: Path | None = typer.Option(
        None,
        callback=_new_file,
        help="also draw who held which server when, as an SVG image, to this file",
    ),
    otlp_endpoint: str | None = typer.Option(
        None, help="send the services' traces to this OTLP/HTTP URL instead of keeping them"
    ),
) -> None:
    """Run the whole system on the embedded cluster, schedule a workload, check, and clean up."""
    console = Console()
    spans = None if otlp_endpoint else _spans_file(work_dir, "demo")
    stack = StackOptions(
        servers=servers,
        cards=cards,
        clients=clients,
        seed=seed,
        granularity=granularity,
        work_dir=work_dir,
        spans_file=spans,
        otlp_endpoint=otlp_endpoint,
    )
    die_with_parent(signal.SIGTERM)
    report = anyio.run(
        _demo, DemoOptions(stack=stack, pods=pods), console, backend_options=loop_options()
    )
    if report is None:
        console.print("[red]interrupted[/]; every process was stopped")
        raise typer.Exit(code=130)
    print_report(report, console)
    _print_traces(console, spans, otlp_endpoint, report.slowest)
    if timeline is not None and report.timeline is not None:
        title = f"rgpu demo: {pods} pods, as the kubelet ran them"
        timeline.write_text(timeline_svg([report.timeline], title=title))
        console.print(f"timeline: {timeline}", soft_wrap=True, highlight=False)
    raise typer.Exit(code=0 if report.ok else 1)


def _spans_file(work_dir: Path | None, command: str) -> Path:
    """Where a stack keeps its spans: the work dir, or a file of its own that outlives it."""
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        return work_dir / "spans.jsonl"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.gettempdir()) / f"rgpu-{command}-{stamp}-{os.getpid()}-spans.jsonl"


def _print_traces(console: Console, spans: Path | None, endpoint: str | None, pod: str) -> None:
    if spans is None:
        console.print(f"traces were sent to {endpoint}", soft_wrap=True, highlight=False)
        return
    console.print(f"traces kept in {spans}; the pod that waited longest:", highlight=False)
    command = f"{SPANS_VARIABLE}={spans} rgpu trace {pod or 'NAMESPACE/POD'}"
    console.print(command, soft_wrap=True, highlight=False)


def _lost_policy(value: str) -> str:
    if value not in ("keep", "evict"):
        raise typer.BadParameter("must be 'keep' or 'evict'")
    return value


def _faults(value: str) -> str:
    if value not in ("standard", "none"):
        raise typer.BadParameter("must be 'standard' or 'none'")
    return value


def _admission(value: str) -> str:
    if value not in ("gate", "filter"):
        raise typer.BadParameter("must be 'gate' or 'filter'")
    return value


@app.command()
def soak(
    servers: int = typer.Option(8, min=1, help="lupine servers to simulate"),
    cards: int = typer.Option(4, min=1, help="GPUs per server"),
    clients: int = typer.Option(12, min=1, help="GPU-less client nodes"),
    pods: int = typer.Option(1000, min=1, help="pods in the stream"),
    replicas: int = typer.Option(2, min=1, help="replicas of every service (metrics too)"),
    granularity: str = typer.Option("server", callback=_granularity, help="server | card"),
    faults: str = typer.Option("standard", callback=_faults, help="standard | none"),
    ttl_seconds: float = typer.Option(10.0, min=0.5, help="booking TTL of the allocator"),
    seed: int = typer.Option(1, help="seed for the fleet, the workload and the faults"),
    wake_limit_seconds: float = typer.Option(
        2.0, min=0.0, help="p99 wake-up limit; 0 prints the wake-ups without judging them"
    ),
    priority_mix: float = typer.Option(
        0.1, min=0.0, max=1.0, help="share of urgent pods (0 turns the priority mix off)"
    ),
    admission: str = typer.Option(
        "gate", callback=_admission, help="gate (rgpu admits behind a gate) | filter (HAMi's)"
    ),
    queues: str = typer.Option(
        "standard", callback=_faults, help="standard (teams with quotas, gangs) | none"
    ),
    load: float = typer.Option(
        LOAD, min=0.0, help="share of the fleet the stream asks for; its rate follows (0: as is)"
    ),
    timeout_seconds: float | None = typer.Option(
        None, min=1.0, help="deadline; default: derived from the workload and the fleet"
    ),
    work_dir: Path | None = typer.Option(None, help="keep service logs here"),
    trace: Path | None = typer.Option(
        None,
        callback=_new_file,
        help="write every pod's scheduling history here, one JSON line per pod",
    ),
    on_server_lost: str = typer.Option(
        "keep", callback=_lost_policy, help="keep | evict: the allocators' RGPU_ON_SERVER_LOST"
    ),
) -> None:
    """Run the replicated system under a long workload and injected faults; PASS/FAIL lines.
    Exits 1 on a FAIL, 2 (before starting) when the run could not finish."""
    console = Console()
    stack = StackOptions(
        servers=servers,
        cards=cards,
        clients=clients,
        seed=seed,
        granularity=granularity,
        replicas=replicas,
        booking_ttl_seconds=ttl_seconds,
        h2only_share=0.25 if faults == "standard" else 0.0,
        work_dir=work_dir,
        trace_scheduler=trace is not None,
    )
    shape = WorkloadShape(
        pods=pods, seed=seed, max_cards=min(2, cards), priority_share=priority_mix
    )
    if admission == "filter" and queues == "standard":
        console.print(
            "[red]--admission filter has no queues[/] (quotas, fair share and gangs are "
            "admission's): add --queues none"
        )
        raise typer.Exit(code=2)
    options = SoakOptions(
        stack=stack,
        workload=shape,
        faults=faults == "standard",
        wake_limit_seconds=wake_limit_seconds or None,
        trace=trace,
        admission=admission,
        queues=queues == "standard",
        load=load,
        timeout_seconds=timeout_seconds,
        on_server_lost=on_server_lost,
    )
    plan = plan_for(options)
    if plan.problems:
        console.print("[red]this soak cannot finish[/]:", highlight=False)
        for problem in plan.problems[:10]:
            console.print(f"  {problem}", soft_wrap=True, highlight=False)
        arithmetic = f"  the arithmetic: {plan.sizing.describe()}"
        console.print(arithmetic, soft_wrap=True, highlight=False)
        raise typer.Exit(code=2)
    # The emulators' watches are cut on purpose; their retries are not news.
    logging.getLogger("rgpu_runtime").setLevel(logging.ERROR)
    die_with_parent(signal.SIGTERM)
    report = anyio.run(_soak, options, console, plan, backend_options=loop_options())
    if report is None:
        console.print("[red]interrupted[/]; every process was stopped")
        raise typer.Exit(code=130)
    print_soak_report(report, console)
    raise typer.Exit(code=0 if report.ok else 1)


async def _soak(options: SoakOptions, console: Console, plan: SoakPlan) -> SoakReport | None:
    return await run_until_stopped(lambda: run_soak(options, console, plan))


async def _demo(options: DemoOptions, console: Console) -> DemoReport | None:
    return await run_until_stopped(lambda: run_demo(options, console))


app.command()(up)
app.command()(env)
app.command()(down)


app.command()(status)


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


@app.command("queue")
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


@app.command("explain")
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


app.command("simulate")(simulate_command)


@app.command("trace")
def trace_command(
    pod: str = typer.Argument(..., help="NAMESPACE/NAME of the pod"),
    spans_file: Path | None = typer.Option(
        None,
        "--file",
        envvar=SPANS_VARIABLE,
        help="the spans a stack kept (rgpu up --sim prints it)",
        show_default=False,
    ),
    depth: int = typer.Option(0, min=0, help="span levels to draw; 1 shows only the steps"),
) -> None:
    """A pod's scheduling as a waterfall: every step's spans, the slowest step marked."""
    status = trace_pod(pod, spans_file, depth, Console(), Console(stderr=True))
    raise typer.Exit(code=status)


# Running the pool (``pool``): maintenance and usage.
app.command("cordon")(cordon_command)
app.command("uncordon")(uncordon_command)
app.command("drain")(drain_command)
app.command("usage")(usage_command)


def main() -> None:
    """Entry point of the ``rgpu`` console script."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # The commands report the apiserver's problems themselves, in one line each; the client
    # library's own warnings ("Config not found: ~/.kube/config") would only add noise.
    logging.getLogger("kubernetes_asyncio").setLevel(logging.ERROR)
    app()
