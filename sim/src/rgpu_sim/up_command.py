"""The ``rgpu up``, ``rgpu env`` and ``rgpu down`` commands: options and exit codes only;
the stack itself is ``up.run_up``, its files ``stack_dir.StackDir``. ``up --detach`` starts
the same command again in the background (a session of its own, so closing the terminal does
not stop it), relays what it prints until every service is ready, and returns; ``env`` and
``down`` reach it through its work directory."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import anyio
import typer
from rich.console import Console
from rich.markup import escape

from .arguments import check_granularity
from .processes import die_with_parent, run_until_stopped
from .stack import StackOptions, loop_options
from .stack_dir import StackDir, StackDirError, default_work_dir
from .up import SPANS_FILE, PortError, UpOptions, plan_ports, refuse_busy, run_up

__all__ = ["down", "env", "up"]


def _fail(console: Console, message: str, code: int = 2) -> typer.Exit:
    # The message may quote a service's log, whose brackets are not rich markup.
    console.print(f"[red]rgpu up:[/] {escape(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(code=code)


def up(
    sim: bool = typer.Option(False, "--sim", help="run on the embedded simulated cluster"),
    servers: int = typer.Option(6, min=1, help="lupine servers to simulate"),
    cards: int = typer.Option(4, min=1, help="GPUs per server"),
    clients: int = typer.Option(12, min=1, help="GPU-less client nodes"),
    granularity: str = typer.Option("server", callback=check_granularity, help="server | card"),
    per_gpu: bool = typer.Option(
        False, "--per-gpu", help="one lupine per GPU on every server node (docs/lupine.md)"
    ),
    seed: int = typer.Option(1, help="seed for the fleet"),
    replicas: int = typer.Option(1, min=1, max=8, help="processes per service, behind a Service"),
    probe_interval: float = typer.Option(
        1.0, min=0.1, max=3600.0, help="seconds between discovery's probes of each server"
    ),
    run_seconds: float | None = typer.Option(
        None,
        min=0.0,
        help="how long a pod without a sim.rgpu.io/run-seconds annotation runs "
        "(default: until it is deleted)",
    ),
    port_offset: int = typer.Option(
        0, help="add this to every port (6443, 8081-8083, 9400, 8443) to run a second stack"
    ),
    apiserver_port: int | None = typer.Option(
        None, min=0, max=65535, help="the simulated apiserver's port (default 6443 + offset)"
    ),
    work_dir: Path = typer.Option(
        default_work_dir(), help="kubeconfig, exports and logs (kept after the stack stops)"
    ),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="return once ready, leaving the stack running"
    ),
    otlp_endpoint: str | None = typer.Option(
        None, help="send the services' traces to this OTLP/HTTP URL instead of keeping them"
    ),
    server_policies: bool = typer.Option(
        False,
        "--server-policies",
        help="RGPU_SERVER_POLICIES=on on a cluster that enforces NetworkPolicy: only a "
        "server's holders reach its lupine",
    ),
    in_background: bool = typer.Option(False, "--in-background", hidden=True),
) -> None:
    """Bring the stack up and leave it running (Ctrl-C or `rgpu down` stops it)."""
    console = Console()
    if not sim:
        raise typer.BadParameter(
            "only --sim is supported here; deploy to a cluster with k8s/ (see README)"
        )
    try:
        ports = plan_ports(port_offset, apiserver_port)
        refuse_busy(ports)
        StackDir(work_dir).claim()
    except (PortError, StackDirError) as exc:
        raise _fail(console, str(exc)) from None
    if detach:
        _detach(work_dir, console)
        return
    stack = StackOptions(
        servers=servers,
        cards=cards,
        clients=clients,
        seed=seed,
        granularity=granularity,
        per_gpu=per_gpu,
        replicas=replicas,
        probe_interval_seconds=probe_interval,
        apiserver_port=ports.pop("apiserver"),
        ports=ports,
        spans_file=None if otlp_endpoint else work_dir / SPANS_FILE,
        otlp_endpoint=otlp_endpoint,
        server_policies=server_policies,
    )
    options = UpOptions(stack=stack, work_dir=work_dir, run_seconds=run_seconds)
    if not in_background:
        # Stopping whatever started this command (``uv run``, a shell) stops it, and the stack.
        die_with_parent(signal.SIGTERM)
    try:
        anyio.run(
            run_until_stopped,
            partial(run_up, options, console),
            backend_options=loop_options(),
        )
    except KeyboardInterrupt:  # Ctrl-C before the signal receiver was listening
        pass
    except OSError as exc:  # a port taken between the check and the bind
        raise _fail(console, f"{exc}; free it, or move every port with --port-offset N") from None
    except RuntimeError as exc:  # a service that never became ready, with its log's tail
        raise _fail(console, str(exc), code=1) from None


def _background_command() -> list[str]:
    args = [a for a in sys.argv[1:] if a not in ("--detach", "-d")]
    return [sys.executable, "-m", "rgpu_cli", *args, "--in-background"]


def _detach(work_dir: Path, console: Console) -> None:
    where = StackDir(work_dir)
    where.pid_file.unlink(missing_ok=True)
    with where.log.open("wb") as log:
        child = subprocess.Popen(
            _background_command(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    shown = 0
    while not where.env_file.is_file() and child.poll() is None:
        time.sleep(0.2)
        shown = _relay(where.log, shown, console)
    _relay(where.log, shown, console)
    if child.poll() is not None:
        raise _fail(console, f"the stack did not start (its output: {where.log})", code=1)
    console.print(f"running in the background (pid {child.pid}); `rgpu down` stops it")


def _relay(log: Path, shown: int, console: Console) -> int:
    """Print what the background stack wrote since ``shown`` bytes; the new offset."""
    data = log.read_bytes()
    text = data[shown:].decode(errors="replace")
    complete = text.rpartition("\n")[0]
    if complete:
        console.print(complete, soft_wrap=True, highlight=False, markup=False)
        return shown + len(complete.encode()) + 1
    return shown


def _where(work_dir: Path) -> StackDir:
    return StackDir(work_dir)


def env(
    work_dir: Path = typer.Option(default_work_dir(), help="the work directory of `rgpu up`"),
) -> None:
    """Print the running stack's exports: eval "$(rgpu env)" sets KUBECONFIG and the URLs."""
    try:
        sys.stdout.write(_where(work_dir).exports())
    except StackDirError as exc:
        Console(stderr=True).print(
            f"[red]rgpu env:[/] {escape(str(exc))}", soft_wrap=True, highlight=False
        )
        raise typer.Exit(code=1) from None


def down(
    work_dir: Path = typer.Option(default_work_dir(), help="the work directory of `rgpu up`"),
) -> None:
    """Stop the stack `rgpu up` left running (its logs stay in the work directory)."""
    console = Console()
    try:
        stopped = _where(work_dir).stop()
    except StackDirError as exc:
        console.print(f"[red]rgpu down:[/] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise typer.Exit(code=1) from None
    if stopped is None:
        console.print(f"nothing to stop: no stack is running from {work_dir}", soft_wrap=True)
        return
    console.print(f"stopped the stack (pid {stopped}); logs kept in {work_dir}", soft_wrap=True)
