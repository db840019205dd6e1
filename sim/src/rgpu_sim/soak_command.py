"""The ``rgpu soak`` command: options, the refusal of a soak that cannot finish (before anything
starts), and exit codes; the run itself is ``soak.run_soak``."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import anyio
import typer
from rich.console import Console

from rgpu_kubesim import AddressUnavailable

from .arguments import check_granularity, check_new_file
from .processes import die_with_parent, run_until_stopped
from .soak import SoakOptions, SoakReport, plan_for, print_soak_report, run_soak
from .soak_plan import SoakPlan
from .soak_sizing import LOAD
from .soak_workload import WorkloadShape
from .stack import StackOptions, loop_options

__all__ = ["soak"]


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


def soak(
    servers: int = typer.Option(8, min=1, help="lupine servers to simulate"),
    cards: int = typer.Option(4, min=1, help="GPUs per server"),
    clients: int = typer.Option(12, min=1, help="GPU-less client nodes"),
    pods: int = typer.Option(1000, min=1, help="pods in the stream"),
    replicas: int = typer.Option(2, min=1, help="replicas of every service (metrics too)"),
    granularity: str = typer.Option("server", callback=check_granularity, help="server | card"),
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
        callback=check_new_file,
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
    try:
        report = anyio.run(_soak, options, console, plan, backend_options=loop_options())
    except* AddressUnavailable as group:
        # The fleet's addresses follow the seed: a fake server healed from "down" finds its
        # address taken when another soak (or demo) of the same seed runs beside this one.
        console.print(f"[red]the soak stopped[/]: {group.exceptions[0]}", highlight=False)
        console.print(
            f"  the fake lupine addresses follow --seed: is another run of seed {seed} "
            "using them? Give one of them another --seed.",
            highlight=False,
        )
        raise typer.Exit(code=2) from None
    if report is None:
        console.print("[red]interrupted[/]; every process was stopped")
        raise typer.Exit(code=130)
    print_soak_report(report, console)
    raise typer.Exit(code=0 if report.ok else 1)


async def _soak(options: SoakOptions, console: Console, plan: SoakPlan) -> SoakReport | None:
    return await run_until_stopped(lambda: run_soak(options, console, plan))
