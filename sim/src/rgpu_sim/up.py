"""``rgpu up --sim`` is how a newcomer meets rgpu: the whole system on the simulated cluster,
left running to be poked at with kubectl and ``rgpu``. What it prints must work as pasted, in
another shell, and keep working across restarts: so the ports are the services' own defaults
(6443, 8081, 8082, 8083, 9400, 8443; ``--port-offset`` moves them all), kubectl gets a
kubeconfig in the work directory (``stack_dir``), and the exports name it. A service that
dies is reported at once, with its log, instead of leaving a stack that silently does nothing.
"""

from __future__ import annotations

import math
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import anyio
from rich.console import Console
from rich.markup import escape

from .stack import Stack, StackOptions, run_stack
from .stack_dir import StackDir
from .steps import Steps
from .trace import SPANS_VARIABLE

__all__ = [
    "DEFAULT_PORTS",
    "PortError",
    "UpOptions",
    "busy_ports",
    "free_offset",
    "plan_ports",
    "refuse_busy",
    "run_up",
]

DEFAULT_PORTS: Final[Mapping[str, int]] = {
    "apiserver": 6443,
    "discovery": 8081,
    "allocator": 8082,
    "extender": 8083,
    "metrics": 9400,
    "webhook": 8443,
}
"""Each service's own default listen port, and the apiserver's usual one: ``rgpu status``
and the services' READMEs assume these, so they work against ``rgpu up`` unchanged."""


SPANS_FILE = "spans.jsonl"
"""Where in the work directory the services' spans are kept for ``rgpu trace``."""


class PortError(ValueError):
    """A port cannot be used; the message names it, its owner and the fix."""


def plan_ports(offset: int, apiserver_port: int | None = None) -> dict[str, int]:
    """Every port moved by ``offset``; ``apiserver_port`` overrides the apiserver's."""
    ports = {name: port + offset for name, port in DEFAULT_PORTS.items()}
    if apiserver_port is not None:
        ports["apiserver"] = apiserver_port
    for name, port in ports.items():
        if not 1 <= port <= 65535:
            raise PortError(
                f"port {port} for the {name} is outside 1..65535: choose a --port-offset "
                f"between {1 - min(DEFAULT_PORTS.values())} and "
                f"{65535 - max(DEFAULT_PORTS.values())}"
            )
    return ports


def busy_ports(ports: Mapping[str, int], host: str = "127.0.0.1") -> list[str]:
    """The ports something already listens on, as ``"8081 (discovery)"``."""
    busy = []
    for name, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                busy.append(f"{port} ({name})")
    return busy


def free_offset(start: int = 100, step: int = 100) -> int | None:
    """The first offset from ``start`` (in ``step``s) at which every port is free now."""
    highest = 65535 - max(DEFAULT_PORTS.values())
    for offset in range(start, highest + 1, step):
        if not busy_ports(plan_ports(offset)):
            return offset
    return None


def refuse_busy(ports: Mapping[str, int]) -> None:
    """Raise ``PortError`` naming every port already taken, and the ways out."""
    busy = busy_ports(ports)
    if busy:
        offset = free_offset()
        hint = f" (--port-offset {offset} is free now)" if offset is not None else ""
        raise PortError(
            f"port {', '.join(busy)} already in use on 127.0.0.1 (another `rgpu up`? "
            f"`rgpu down` stops it): free it, or move every port with --port-offset N{hint}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class UpOptions:
    """What ``rgpu up --sim`` runs and where it keeps its files."""

    stack: StackOptions
    work_dir: Path
    run_seconds: float | None = None
    """How long a pod runs when it does not say (``sim.rgpu.io/run-seconds``); None: until it
    is deleted, as a real workload would."""

    def stack_options(self) -> StackOptions:
        run = math.inf if self.run_seconds is None else self.run_seconds
        kubelet = replace(self.stack.kubelet, default_run_seconds=run)
        return replace(self.stack, kubelet=kubelet, work_dir=self.work_dir)


def _activate_line() -> str | None:
    script = Path(sys.prefix) / "bin" / "activate"
    return f"source {script}" if script.is_file() else None


def _exports(stack: Stack, where: StackDir) -> dict[str, str]:
    return {
        "KUBECONFIG": str(where.kubeconfig),
        "RGPU_DISCOVERY_URL": stack.url("discovery"),
        "RGPU_ALLOCATOR_URL": stack.url("allocator"),
    }


def _print_ready(stack: Stack, where: StackDir, options: UpOptions, console: Console) -> None:
    s = options.stack
    console.print(
        f"[bold]rgpu is up[/] on the simulated cluster: {s.servers} servers x {s.cards} cards, "
        f"{s.clients} client nodes, granularity {s.granularity}"
        + (" (one lupine per GPU)" if s.per_gpu else "")
    )
    rows = {"apiserver": stack.sim.url, **{n: stack.url(n) for n in ("discovery", "allocator")}}
    rows |= {n: stack.url(n) for n in ("extender", "metrics")}
    rows |= {"webhook": stack.webhook_url, "logs": f"{where.path}/ (kept when it stops)"}
    rows["traces"] = str(s.otlp_endpoint or s.spans_file)
    for name, value in rows.items():
        console.print(f"  {name:<10} {value}", soft_wrap=True, highlight=False)
    certs = stack.ca_file.parent
    console.print(
        "The extender's scheduler listener answers kube-scheduler's client certificate only: "
        f"curl --cacert {certs}/ca.crt --cert {certs}/scheduler-client.crt "
        f"--key {certs}/scheduler-client.key {stack.url('extender')}/metrics",
        soft_wrap=True,
        highlight=False,
        markup=False,
    )
    run = options.run_seconds
    console.print(
        'Pods run until deleted; annotate one sim.rgpu.io/run-seconds: "N" to have it '
        "finish after N seconds."
        if run is None
        else f'Pods run {run:g}s unless annotated sim.rgpu.io/run-seconds: "N".'
    )
    console.print('\nIn another shell, paste these lines (or run: eval "$(rgpu env)"):')
    lines = [line for line in (_activate_line(),) if line]
    lines += [f"export {k}={v}" for k, v in _exports(stack, where).items()]
    lines += ["kubectl get nodes -L hami.io/lupine-server", "rgpu status"]
    for line in lines:
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    if s.spans_file is not None and not s.otlp_endpoint:
        console.print(
            f"\nA pod's scheduling story: {SPANS_VARIABLE}={s.spans_file} rgpu trace NAMESPACE/POD",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    console.print("\n`rgpu down` stops everything (so does Ctrl-C when it runs in the foreground).")


def _ended(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


async def _watch_services(stack: Stack, console: Console) -> None:
    """Report each service process that ends; its exit is reaped, not left a zombie."""
    reported: set[str] = set()
    while True:
        await anyio.sleep(0.5)
        for name, service in stack.services.items():
            process = service.process
            if name in reported or process is None or process.poll() is None:
                continue
            reported.add(name)
            console.print(
                f"[red]{name} {_ended(process.returncode)}[/]; the stack is degraded "
                f"until it is restarted (`rgpu down`, then `rgpu up`). Its log, "
                f"{escape(str(service.log_path))}, ends:\n{escape(service.tail(8))}",
                soft_wrap=True,
                highlight=False,
            )


async def run_up(options: UpOptions, console: Console) -> None:
    """Start the stack, publish how to reach it, and run until cancelled."""
    where = StackDir(options.work_dir)
    try:
        with Steps(console) as steps:
            async with run_stack(options.stack_options(), progress=steps) as stack:
                steps.pause()
                try:
                    where.publish(stack.sim.url, _exports(stack, where))
                    _print_ready(stack, where, options, console)
                    await _watch_services(stack, console)
                finally:
                    steps("stopping every process")
    finally:
        where.release()
        console.print(f"stopped; logs kept in {where.path}", soft_wrap=True, highlight=False)
