"""The demo, end-to-end tests and people poking at rgpu by hand need the
simulated cluster as a process — ``python -m rgpu_kubesim serve`` runs the apiserver with a
seeded fleet whose lupine servers really listen, ``certs`` writes the webhook's TLS files.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import anyio

from rgpu_kubesim import ApiOptions, run_apiserver
from rgpu_kubesim._lupine_errors import SimSetupError
from rgpu_kubesim.certs import write_certs
from rgpu_kubesim.fleet import FleetSpec, SeededFleet, plan_fleet, seed_fleet

logger = logging.getLogger("rgpu_kubesim")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeOptions:
    """What ``serve`` was asked to run."""

    host: str
    port: int
    fleet: FleetSpec
    log_level: str


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand; returns the process exit code (2 for bad arguments)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "certs":
            return _certs(args)
        return _serve(_serve_options(args))
    except SimSetupError as exc:
        print(f"rgpu_kubesim {args.command}: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rgpu_kubesim", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the simulated apiserver (and a fleet)")
    serve.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=0, help="listen port (default 0: any free)")
    serve.add_argument("--servers", type=_count, default=0, help="GPU servers to seed")
    serve.add_argument("--cards", type=_positive, default=8, help="GPUs per server")
    serve.add_argument("--clients", type=_count, default=0, help="client nodes to seed")
    serve.add_argument("--seed", type=int, default=0, help="fleet seed (same seed, same fleet)")
    serve.add_argument("--zones", type=_positive, default=2, help="zones in the region")
    serve.add_argument("--racks-per-zone", type=_positive, default=2, help="racks per zone")
    serve.add_argument(
        "--default-port-share", type=_share, default=0.25, help="servers on lupine's port 14833"
    )
    serve.add_argument("--h2only-share", type=_share, default=0.0, help="old HTTP/2-only builds")
    serve.add_argument("--unhealthy-share", type=_share, default=0.0, help="unhealthy cards")
    serve.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING"))
    certs = commands.add_parser("certs", help="write a CA, a serving and a client certificate")
    certs.add_argument("--out", type=Path, required=True, help="directory to write into")
    certs.add_argument("--host", action="append", default=[], help="IP address (repeatable)")
    certs.add_argument("--dns", action="append", default=[], help="DNS name (repeatable)")
    return parser


def _whole(text: str, minimum: int, maximum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not minimum <= value <= maximum:
        raise argparse.ArgumentTypeError(f"{value} is outside {minimum}..{maximum}")
    return value


def _port(text: str) -> int:
    return _whole(text, 0, 65535)


def _count(text: str) -> int:
    return _whole(text, 0, 100_000)


def _positive(text: str) -> int:
    return _whole(text, 1, 1024)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is outside 0..1")
    return value


def _serve_options(args: argparse.Namespace) -> ServeOptions:
    fleet = FleetSpec(
        servers=args.servers,
        cards=args.cards,
        clients=args.clients,
        seed=args.seed,
        zones=args.zones,
        racks_per_zone=args.racks_per_zone,
        default_port_share=args.default_port_share,
        h2only_share=args.h2only_share,
        unhealthy_share=args.unhealthy_share,
    )
    return ServeOptions(host=args.host, port=args.port, fleet=fleet, log_level=args.log_level)


def _certs(args: argparse.Namespace) -> int:
    hosts = args.host or ([] if args.dns else ["127.0.0.1"])
    files = write_certs(args.out, hosts=hosts, dns_names=args.dns)
    print(
        f"wrote {files.ca}, {files.cert} and {files.key}, and kube-scheduler's client "
        f"certificate {files.client_cert} and {files.client_key}"
    )
    return 0


def _serve(options: ServeOptions) -> int:
    logging.basicConfig(
        level=options.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    try:
        anyio.run(_run, options, backend="asyncio", backend_options={"use_uvloop": True})
    except OSError as exc:
        print(f"rgpu_kubesim serve: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0


async def _run(options: ServeOptions) -> None:
    # Listen for signals before anything starts, so a Ctrl-C during seeding still shuts down
    # cleanly (it is read once the cluster is up) instead of tearing through half-built state.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with (
            run_apiserver(host=options.host, port=options.port, options=ApiOptions()) as sim,
            AsyncExitStack() as stack,
        ):
            if options.fleet.servers or options.fleet.clients:
                plan = plan_fleet(options.fleet)
                _log_fleet(await stack.enter_async_context(seed_fleet(sim.store, plan)))
            print(f"kubesim listening on {sim.url}", flush=True)
            async for signum in signals:
                logger.info("received %s; shutting down", signal.Signals(signum).name)
                return


def _log_fleet(seeded: SeededFleet) -> None:
    logger.info(
        "seeded %d servers and %d client nodes (seed %d)",
        len(seeded.plan.servers),
        len(seeded.plan.clients),
        seeded.plan.spec.seed,
    )
    for server in seeded.lupine:
        logger.info("lupine %s (%s) on %s", server.name, server.mode, server.endpoint)


if __name__ == "__main__":
    sys.exit(main())
