"""rgpu's placement rules, once for every service: a pod's demand, the fleet view, the
locality rule, fitting, choosing and assigning, claim validity and precedence,
preemption, and card states.

Standard library and ``rgpu_contracts`` only: no I/O, so the allocator decides with it, the
extender scores and reads pods with it, metrics and the CLI show card states with it, and all
of them agree.
"""

from __future__ import annotations

from ._assigning import (
    assign,
)
from ._capacity import (
    NeverFits,
    capable_servers,
    never_fits,
)
from ._cards import (
    CardState,
    CardView,
    claims_by_server,
    holding_claims,
    view_cards,
)
from ._choosing import (
    Choice,
    Refusal,
    choose,
)
from ._demand import (
    Ask,
    Demand,
    demand_of,
)
from ._errors import (
    InvalidQuantity,
    PlacementError,
)
from ._fitting import (
    BusyIgnored,
    Fit,
    Granularity,
    Holdings,
    Unclaimed,
    fit,
    verdict,
)
from ._fleetview import (
    FleetView,
    ServerFacts,
    server_facts,
)
from ._gating import (
    ADMISSION_GATE,
    gates_after_admission,
    scheduling_gates,
    waits_for_rgpu,
)
from ._locality import (
    shared_level,
    tiers,
)
from ._lookalikes import (
    Lookalike,
    lookalikes,
)
from ._podreading import (
    MAX_QUANTITY,
    ContainerDemand,
    ContainerSlot,
    PodDemand,
    Section,
    container_slots,
    read_cuda_major,
    read_demand,
)
from ._precedence import (
    precedence,
    state_rank,
    winner,
)
from ._preempting import (
    ANNOTATION_NOMINATION,
    MAX_SUBSETS,
    Nomination,
    Preemption,
    Standing,
    preemptions,
)
from ._queues import (
    GANG_LABEL,
    GANG_SIZE_LABEL,
    MAX_CONFIG_BYTES,
    MAX_GANG_SIZE,
    NO_QUEUES,
    FairWalk,
    Gang,
    QueueConfig,
    QueueConfigError,
    Quota,
    cards_by_namespace,
    gang_of,
)
from ._validity import (
    PodFacts,
    Validity,
    claim_stamp,
    claim_ttl,
    expires_at,
    judge,
    lasting,
)

__all__ = [
    "ADMISSION_GATE",
    "ANNOTATION_NOMINATION",
    "GANG_LABEL",
    "GANG_SIZE_LABEL",
    "MAX_CONFIG_BYTES",
    "MAX_GANG_SIZE",
    "MAX_QUANTITY",
    "MAX_SUBSETS",
    "NO_QUEUES",
    "Ask",
    "BusyIgnored",
    "CardState",
    "CardView",
    "Choice",
    "ContainerDemand",
    "ContainerSlot",
    "Demand",
    "FairWalk",
    "Fit",
    "FleetView",
    "Gang",
    "Granularity",
    "Holdings",
    "InvalidQuantity",
    "Lookalike",
    "NeverFits",
    "Nomination",
    "PlacementError",
    "PodDemand",
    "PodFacts",
    "Preemption",
    "QueueConfig",
    "QueueConfigError",
    "Quota",
    "Refusal",
    "Section",
    "ServerFacts",
    "Standing",
    "Unclaimed",
    "Validity",
    "assign",
    "capable_servers",
    "cards_by_namespace",
    "choose",
    "claim_stamp",
    "claim_ttl",
    "claims_by_server",
    "container_slots",
    "demand_of",
    "expires_at",
    "fit",
    "gang_of",
    "gates_after_admission",
    "holding_claims",
    "judge",
    "lasting",
    "lookalikes",
    "never_fits",
    "precedence",
    "preemptions",
    "read_cuda_major",
    "read_demand",
    "scheduling_gates",
    "server_facts",
    "shared_level",
    "state_rank",
    "tiers",
    "verdict",
    "view_cards",
    "waits_for_rgpu",
    "winner",
]
