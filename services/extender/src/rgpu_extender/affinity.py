"""A GPU pod must never run on a lupine server node, and kube-scheduler must know that
before it calls the extender, not learn it from the extender's answer.

kube-scheduler filters only a sample of the feasible nodes in a large cluster
(``percentageOfNodesToScore``: about 300 of 6,000), then calls the extender with that sample.
If server nodes pass kube-scheduler's own filters, a sample can be made of server nodes only;
the extender must refuse all of them, the pod is marked unschedulable, and with no cluster event
to move it back it waits for the five-minute flush. A required node affinity
``hami.io/lupine-server DoesNotExist`` makes kube-scheduler's NodeAffinity plugin drop server
nodes before sampling, so every sample is made of client nodes. Because the extender still
rejects nodes the pod is refused on, kube-scheduler records the extender among the pod's
rejectors and any cluster event (or the allocator's nudge) still moves it back.

Required node selector terms are ORed, so the expression is added to *every* existing term:
the pod's own choice of nodes is kept, and narrowed to client nodes. A required affinity
without terms is invalid and left for the apiserver to refuse with its own message. The
fields read here are type-checked first (``shapes``), so a malformed affinity is a 400 naming
the field, never a patch that fails on the apiserver.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from rgpu_contracts import LABEL_SERVER, pointer

from .objects import mapping

__all__ = ["NOT_A_SERVER", "affinity_ops"]

NOT_A_SERVER = {"key": LABEL_SERVER, "operator": "DoesNotExist"}
"""The node selector requirement every GPU pod carries."""

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"

Op = dict[str, Any]


def affinity_ops(pod: Mapping[str, Any]) -> Iterator[Op]:
    """JSONPatch operations that keep ``pod`` off server nodes; none when it already is."""
    affinity = mapping(pod.get("spec")).get("affinity")
    node_affinity = mapping(affinity).get("nodeAffinity")
    required = mapping(node_affinity).get(_REQUIRED)
    if affinity is None:
        yield _add(("spec", "affinity"), {"nodeAffinity": {_REQUIRED: _one_term()}})
    elif node_affinity is None:
        yield _add(("spec", "affinity", "nodeAffinity"), {_REQUIRED: _one_term()})
    elif required is None:
        yield _add(("spec", "affinity", "nodeAffinity", _REQUIRED), _one_term())
    else:
        yield from _narrow_terms(mapping(required).get("nodeSelectorTerms"))


def _one_term() -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchExpressions": [dict(NOT_A_SERVER)]}]}


def _narrow_terms(terms: object) -> Iterator[Op]:
    if not isinstance(terms, list):
        return
    base = ("spec", "affinity", "nodeAffinity", _REQUIRED, "nodeSelectorTerms")
    for index, term in enumerate(terms):
        expressions = mapping(term).get("matchExpressions")
        if not isinstance(expressions, list):
            yield _add((*base, index, "matchExpressions"), [dict(NOT_A_SERVER)])
        elif NOT_A_SERVER not in expressions:
            yield _add((*base, index, "matchExpressions", "-"), dict(NOT_A_SERVER))


def _add(path: tuple[str | int, ...], value: object) -> Op:
    # "add" replaces a member that is present as null, as RFC 6902 defines it.
    return {"op": "add", "path": pointer(*path), "value": value}
