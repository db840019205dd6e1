"""networking.k8s.io/v1 NetworkPolicies: the defaults and validation kube-apiserver applies.

rgpu writes one policy per lupine server when its server-policies mode is on, and an operator
who got one wrong must hear it from the simulator exactly where a cluster would refuse it: a
peer naming both an ``ipBlock`` and a selector, an ``except`` outside its ``cidr``, a port out
of range, an unknown protocol or policy type. Defaults follow ``SetDefaults_NetworkPolicy``:
``policyTypes`` is ``[Ingress]`` (plus ``Egress`` when egress rules are given) and a port's
protocol is TCP.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Mapping
from typing import Any

from rgpu_kubesim.machinery import (
    Cause,
    forbidden,
    invalid_value,
    label_value_error,
    not_supported,
    qualified_name_error,
    required,
)

JsonObj = dict[str, Any]

POLICY_TYPES = ("Ingress", "Egress")
PROTOCOLS = ("TCP", "UDP", "SCTP")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_PORT_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")
_PORT_NAME_MSG = "must contain only lowercase alphanumerics and '-', start and end with one"


def default_policy(policy: JsonObj) -> None:
    """``policyTypes`` and port protocols, in place (kube's v1 defaulting)."""
    spec = policy.get("spec")
    if not isinstance(spec, dict):
        return
    if not spec.get("policyTypes"):
        spec["policyTypes"] = ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]
    for direction in ("ingress", "egress"):
        for rule in _list(spec.get(direction)):
            for port in _list(rule.get("ports") if isinstance(rule, dict) else None):
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")


def policy_causes(policy: Mapping[str, Any]) -> list[Cause]:
    """Every field kube's ``ValidateNetworkPolicy`` would refuse, with its path."""
    spec = policy.get("spec")
    if not isinstance(spec, dict):
        return [required("spec")]
    causes = list(selector_causes("spec.podSelector", spec.get("podSelector"), needed=True))
    causes += _types_causes(spec.get("policyTypes"))
    for direction, peers in (("ingress", "from"), ("egress", "to")):
        for index, rule in enumerate(_list(spec.get(direction))):
            causes += _rule_causes(f"spec.{direction}[{index}]", rule, peers)
    return causes


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _types_causes(types: Any) -> list[Cause]:
    if not isinstance(types, list):
        return [invalid_value("spec.policyTypes", types, "must be a list")]
    if len(types) > len(POLICY_TYPES):
        return [
            invalid_value("spec.policyTypes", types, "may not specify more than two policyTypes")
        ]
    return [
        not_supported(f"spec.policyTypes[{i}]", kind, POLICY_TYPES)
        for i, kind in enumerate(types)
        if kind not in POLICY_TYPES
    ]


def _rule_causes(path: str, rule: Any, peers: str) -> list[Cause]:
    if not isinstance(rule, dict):
        return [invalid_value(path, rule, "must be an object")]
    causes: list[Cause] = []
    for index, port in enumerate(_list(rule.get("ports"))):
        causes += _port_causes(f"{path}.ports[{index}]", port)
    for index, peer in enumerate(_list(rule.get(peers))):
        causes += _peer_causes(f"{path}.{peers}[{index}]", peer)
    return causes


def _port_causes(path: str, port: Any) -> list[Cause]:
    if not isinstance(port, dict):
        return [invalid_value(path, port, "must be an object")]
    causes: list[Cause] = []
    protocol = port.get("protocol", "TCP")
    if protocol not in PROTOCOLS:
        causes.append(not_supported(f"{path}.protocol", protocol, PROTOCOLS))
    number, end = port.get("port"), port.get("endPort")
    causes += _port_value_causes(f"{path}.port", number)
    if end is not None:
        causes += _end_port_causes(path, number, end)
    return causes


def _port_value_causes(path: str, value: Any) -> list[Cause]:
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int | str):
        return [invalid_value(path, value, "must be a port number or an IANA_SVC_NAME")]
    if isinstance(value, int):
        return [] if 1 <= value <= 65535 else [invalid_value(path, value, "must be 1-65535")]
    return _port_name_causes(path, value)


def _port_name_causes(path: str, name: str) -> list[Cause]:
    if len(name) > 15:
        return [invalid_value(path, name, "must be no more than 15 characters")]
    if not _PORT_NAME.match(name) or "--" in name:
        return [invalid_value(path, name, _PORT_NAME_MSG + ", and no '--'")]
    if not any(c.isalpha() for c in name):
        return [invalid_value(path, name, "must contain at least one letter (a-z)")]
    return []


def _end_port_causes(path: str, number: Any, end: Any) -> list[Cause]:
    if not isinstance(number, int) or isinstance(number, bool):
        return [required(f"{path}.port", "must be specified, as a number, when endPort is")]
    if isinstance(end, bool) or not isinstance(end, int) or not 1 <= end <= 65535:
        return [invalid_value(f"{path}.endPort", end, "must be 1-65535")]
    if end < number:
        return [invalid_value(f"{path}.endPort", end, "must be greater than or equal to `port`")]
    return []


def _peer_causes(path: str, peer: Any) -> list[Cause]:
    if not isinstance(peer, dict):
        return [invalid_value(path, peer, "must be an object")]
    selectors = peer.get("podSelector") is not None or peer.get("namespaceSelector") is not None
    block = peer.get("ipBlock") is not None
    if not selectors and not block:
        return [required(path, "must specify a peer")]
    if selectors and block:
        return [forbidden(path, "may not specify more than 1 peer")]
    if block:
        return _block_causes(f"{path}.ipBlock", peer["ipBlock"])
    causes = list(selector_causes(f"{path}.podSelector", peer.get("podSelector")))
    return causes + list(
        selector_causes(f"{path}.namespaceSelector", peer.get("namespaceSelector"))
    )


def _block_causes(path: str, block: Any) -> list[Cause]:
    if not isinstance(block, dict):
        return [invalid_value(path, block, "must be an object")]
    cidr = block.get("cidr")
    if not cidr:
        return [required(f"{path}.cidr")]
    network = _network(cidr)
    if network is None:
        return [invalid_value(f"{path}.cidr", cidr, "must be a valid CIDR, e.g. 10.0.0.0/8")]
    causes = []
    for index, text in enumerate(_list(block.get("except"))):
        inner = _network(text)
        field = f"{path}.except[{index}]"
        if inner is None:
            causes.append(invalid_value(field, text, "must be a valid CIDR"))
        elif inner.version != network.version or not _strict_subnet(inner, network):
            causes.append(invalid_value(field, text, "must be a strict subset of `cidr`"))
    return causes


def _network(text: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    if not isinstance(text, str) or "/" not in text:
        return None
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def _strict_subnet(
    inner: ipaddress.IPv4Network | ipaddress.IPv6Network,
    outer: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> bool:
    return inner.prefixlen > outer.prefixlen and inner.subnet_of(outer)  # type: ignore[arg-type]


def selector_causes(path: str, selector: Any, *, needed: bool = False) -> Iterator[Cause]:
    """``metav1.ValidateLabelSelector``: keys, values and operators of a label selector."""
    if selector is None:
        if needed:
            yield required(path)
        return
    if not isinstance(selector, dict):
        yield invalid_value(path, selector, "must be a label selector")
        return
    labels = selector.get("matchLabels") or {}
    for key, value in labels.items() if isinstance(labels, dict) else ():
        problem = qualified_name_error(str(key))
        if problem:
            yield invalid_value(f"{path}.matchLabels", key, problem)
        value_problem = label_value_error(value) if isinstance(value, str) else "must be a string"
        if value_problem:
            yield invalid_value(f"{path}.matchLabels", value, value_problem)
    for index, expression in enumerate(_list(selector.get("matchExpressions"))):
        yield from _expression_causes(f"{path}.matchExpressions[{index}]", expression)


def _expression_causes(path: str, expression: Any) -> Iterator[Cause]:
    if not isinstance(expression, dict):
        yield invalid_value(path, expression, "must be an object")
        return
    problem = qualified_name_error(str(expression.get("key") or ""))
    if problem:
        yield invalid_value(f"{path}.key", expression.get("key"), problem)
    operator, values = expression.get("operator"), _list(expression.get("values"))
    if operator not in _OPERATORS:
        yield not_supported(f"{path}.operator", operator, _OPERATORS)
    elif operator in ("In", "NotIn") and not values:
        yield required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'")
    elif operator in ("Exists", "DoesNotExist") and values:
        detail = "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
        yield forbidden(f"{path}.values", detail)
