"""10,000 cards are 110,000 series, too many to format on every scrape.

The card families are written here as exposition text, one server at a time, so that the
board can keep each server's lines until that server or its claims change, and a scrape only
joins ready-made bytes. The sample lines are the same in the Prometheus text format and in
OpenMetrics (every family is a gauge, values are integers, label names are legacy-valid);
only the holder family's ``# TYPE`` differs (``info`` in OpenMetrics, where the family is
named without its ``_info`` suffix), so a block keeps headers apart from samples.

HAMi's families keep HAMi's names and labels exactly (docs/design.md §3); ``device_cores`` and
``device_memory_limit`` (MiB, as HAMi's own overview reports it) are properties of the card,
never of its load, so no label value churns with scheduling except ``state`` and the holder.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from rgpu_contracts import DEVICE_TYPE, Card, Claim, Server
from rgpu_placement import CardState, CardView, holding_claims, view_cards

__all__ = [
    "FAMILIES",
    "CardBlock",
    "Family",
    "ServerLines",
    "assemble",
    "render_server",
]

logger = logging.getLogger(__name__)

MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """One exported metric family: its sample name, help text and OpenMetrics spelling."""

    name: str
    help: str
    openmetrics_name: str | None = None
    openmetrics_type: str = "gauge"

    def header(self, *, openmetrics: bool) -> str:
        """The ``# HELP``/``# TYPE`` lines for the chosen format."""
        name, kind = self.name, "gauge"
        if openmetrics:
            name, kind = self.openmetrics_name or self.name, self.openmetrics_type
        return f"# HELP {name} {self.help}\n# TYPE {name} {kind}\n"


FAMILIES = (
    Family(
        name="hami_remote_gpu_memory_limit_bytes",
        help="Memory of a remote GPU card in bytes.",
    ),
    Family(
        name="hami_remote_gpu_allocated",
        help="1 when the remote GPU card is claimed by a pod or busy on its server, else 0.",
    ),
    Family(
        name="hami_remote_gpu_overview",
        help="Allocated memory of a remote GPU card in bytes: the whole card when held, else 0.",
    ),
    Family(
        name="rgpu_card_state",
        help="1 for the card's state, 0 for the others; precedence unavailable > unhealthy > "
        "bound > committed > booked > busy > free. cuda_version: what the card's lupine "
        "reports (empty until known).",
    ),
    Family(
        name="rgpu_card_holder_info",
        help="The pod whose claim holds the card; one series per held card.",
        openmetrics_name="rgpu_card_holder",
        openmetrics_type="info",
    ),
    Family(
        name="rgpu_server_up",
        help="1 when the server's Node is Ready and its lupine port answers, else 0.",
    ),
    Family(name="rgpu_server_cards", help="Remote GPU cards the server registers."),
    Family(
        name="rgpu_card_cordoned",
        help="1 when no new pod is booked on the card: its Node is cordoned or the card is in "
        "the Node's hami.io/device-cordon annotation (holders stay), else 0.",
    ),
    Family(
        name="rgpu_server_cordoned",
        help="1 when the server's Node is cordoned (spec.unschedulable), else 0.",
    ),
)
"""Every family the board renders, in exposition order."""

(
    _MEMORY,
    _ALLOCATED,
    _OVERVIEW,
    _STATE,
    _HOLDER,
    _UP,
    _CARDS,
    _CARD_CORDONED,
    _SERVER_CORDONED,
) = range(len(FAMILIES))

ServerLines = tuple[str, ...]
"""One server's sample lines, one string per family of ``FAMILIES`` (possibly empty)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CardBlock:
    """The samples of every card family, ready to send; headers are added per format."""

    samples: tuple[bytes, ...]

    def parts(self, *, openmetrics: bool) -> list[bytes]:
        """Headers and samples of every family, in order, for ``b"".join``."""
        parts: list[bytes] = []
        for family, samples in zip(FAMILIES, self.samples, strict=True):
            parts += (family.header(openmetrics=openmetrics).encode(), samples)
        return parts

    @property
    def size(self) -> int:
        """Bytes of samples held."""
        return sum(len(samples) for samples in self.samples)


def assemble(servers: Sequence[ServerLines]) -> CardBlock:
    """Join servers' lines family by family (servers in the given order)."""
    return CardBlock(
        samples=tuple(
            "".join(lines[family] for lines in servers).encode() for family in range(len(FAMILIES))
        )
    )


def render_server(server: Server, claims: Iterable[Claim]) -> ServerLines:
    """Every card family's lines for ``server``, given the claims naming it."""
    views = view_cards(_own_cards(server), holding_claims(claims))
    server_label = f'server="{_escape(server.name)}"'
    hami_prefix = f'{server_label},endpoint="{_escape(server.endpoint or "")}",'
    per_family: list[list[str]] = [[] for _ in FAMILIES]
    version = f'cuda_version="{_escape(server.cuda_version or "")}"'
    for view in views:
        for family, line in _card_lines(server_label, hami_prefix, view, version):
            per_family[family].append(line)
        cordoned = int(server.cordoned or view.card.cordoned)
        card = f'{server_label},card="{_escape(view.card.id)}"'
        per_family[_CARD_CORDONED].append(f"rgpu_card_cordoned{{{card}}} {cordoned}\n")
    per_family[_UP].append(_server_up(hami_prefix, server))
    per_family[_CARDS].append(f"rgpu_server_cards{{{server_label}}} {len(views)}\n")
    cordon = f"rgpu_server_cordoned{{{hami_prefix.rstrip(',')}}} {int(server.cordoned)}\n"
    per_family[_SERVER_CORDONED].append(cordon)
    return tuple("".join(lines) for lines in per_family)


def _card_lines(
    server_label: str, hami_prefix: str, view: CardView, version: str
) -> Iterable[tuple[int, str]]:
    card = view.card
    hami = f'{hami_prefix}device_uuid="{_escape(card.id)}",device_index="{card.index}",'
    hami += f'device_type="{DEVICE_TYPE}"'
    memory = card.memory_mib * MIB
    allocated = int(view.allocated)
    yield _MEMORY, f"hami_remote_gpu_memory_limit_bytes{{{hami}}} {memory}\n"
    yield _ALLOCATED, f"hami_remote_gpu_allocated{{{hami}}} {allocated}\n"
    overview = f'{hami},device_cores="{card.cores}",device_memory_limit="{card.memory_mib}"'
    yield _OVERVIEW, f"hami_remote_gpu_overview{{{overview}}} {memory * allocated}\n"
    rgpu = f'{server_label},card="{_escape(card.id)}"'
    yield _STATE, _state_lines(f"{rgpu},{version}", view.state)
    if view.holder is not None:
        pod = view.holder.pod
        holder = f'{rgpu},namespace="{_escape(pod.namespace)}",pod="{_escape(pod.name)}"'
        yield _HOLDER, f"rgpu_card_holder_info{{{holder}}} 1\n"


def _state_lines(labels: str, current: CardState) -> str:
    return "".join(
        f'rgpu_card_state{{{labels},state="{state.value}"}} {int(state is current)}\n'
        for state in CardState
    )


def _server_up(hami_prefix: str, server: Server) -> str:
    up = int(server.ready and server.reachable)
    return f"rgpu_server_up{{{hami_prefix.rstrip(',')}}} {up}\n"


def _own_cards(server: Server) -> Server:
    """``server`` without cards that would be exported twice or under the wrong server.

    A card id is ``<server>/<uuid>``, so keeping only ids under their own server (once each)
    makes every card id unique across the whole exposition, which Prometheus requires.
    """
    seen: set[str] = set()
    kept: list[Card] = []
    for card in server.cards:
        if card.id in seen or not card.id.startswith(f"{server.name}/"):
            logger.warning(
                "card %r of server %r skipped: duplicate or not under its server",
                card.id,
                server.name,
            )
            continue
        seen.add(card.id)
        kept.append(card)
    if len(kept) == len(server.cards):
        return server
    return replace(server, cards=tuple(kept))


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value
