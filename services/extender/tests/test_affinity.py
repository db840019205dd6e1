"""The CREATE mutation keeps GPU pods off lupine server nodes with a required node affinity,
merged with the pod's own: every patch is applied with the jsonpatch library, as the
apiserver would apply it, and the result is checked against kubernetes' own schema."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from rgpu_extender.admission import AdmissionPolicy, decide

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
NOT_A_SERVER = {"key": "hami.io/lupine-server", "operator": "DoesNotExist"}
IN_ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}
ON_NODE = {"key": "metadata.name", "operator": "In", "values": ["client-7"]}


def mutated(build, the_pod: dict[str, Any]) -> dict[str, Any]:
    review = decide(build.review(the_pod), AdmissionPolicy.from_settings(build.settings())).review
    assert review["response"]["allowed"] is True, review
    patched = build.patched(review, the_pod)
    kubernetes_validate.validate(patched, kubernetes_validate.latest_version(), strict=True)
    return patched


def with_affinity(build, affinity: object) -> dict[str, Any]:
    return build.pod(build.container(count="1"), affinity=affinity)


def required_terms(the_pod: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = the_pod["spec"]["affinity"]["nodeAffinity"][REQUIRED][
        "nodeSelectorTerms"
    ]
    return terms


@pytest.mark.parametrize("affinity", [None, {}, {"nodeAffinity": None}, {"nodeAffinity": {}}])
def test_a_gpu_pod_without_a_required_node_affinity_gets_one_excluding_server_nodes(
    build, affinity: object
) -> None:
    the_pod = build.pod(build.container(count="1"))
    if affinity is not None:
        the_pod["spec"]["affinity"] = affinity
    assert required_terms(mutated(build, the_pod)) == [{"matchExpressions": [NOT_A_SERVER]}]


def test_every_term_of_the_pods_own_required_affinity_is_narrowed_to_client_nodes(build) -> None:
    own = {
        "nodeSelectorTerms": [
            {"matchExpressions": [IN_ZONE]},
            {"matchFields": [ON_NODE]},
            {"matchExpressions": None, "matchFields": [ON_NODE]},
        ]
    }
    the_pod = with_affinity(build, {"nodeAffinity": {REQUIRED: own}})
    assert required_terms(mutated(build, the_pod)) == [
        {"matchExpressions": [IN_ZONE, NOT_A_SERVER]},
        {"matchFields": [ON_NODE], "matchExpressions": [NOT_A_SERVER]},
        {"matchExpressions": [NOT_A_SERVER], "matchFields": [ON_NODE]},
    ]


def test_preferred_node_affinity_and_pod_affinity_are_kept_beside_the_required_term(
    build,
) -> None:
    preferred = [{"weight": 5, "preference": {"matchExpressions": [IN_ZONE]}}]
    pod_affinity = {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 1,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"app": "db"}},
                    "topologyKey": "kubernetes.io/hostname",
                },
            }
        ]
    }
    affinity = {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred},
        "podAffinity": pod_affinity,
    }
    patched = mutated(build, with_affinity(build, affinity))
    node_affinity = patched["spec"]["affinity"]["nodeAffinity"]
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert patched["spec"]["affinity"]["podAffinity"] == pod_affinity
    assert required_terms(patched) == [{"matchExpressions": [NOT_A_SERVER]}]


def test_a_term_already_excluding_server_nodes_is_left_alone(build) -> None:
    own = {"nodeSelectorTerms": [{"matchExpressions": [NOT_A_SERVER, IN_ZONE]}]}
    patched = mutated(build, with_affinity(build, {"nodeAffinity": {REQUIRED: own}}))
    assert required_terms(patched) == own["nodeSelectorTerms"]


def test_a_pod_asking_for_no_gpu_keeps_its_affinity_untouched(build) -> None:
    the_pod = build.pod(build.container(), scheduler=None)
    assert "affinity" not in mutated(build, the_pod)["spec"]


@pytest.mark.parametrize(
    ("affinity", "field"),
    [
        ([], "spec.affinity"),
        ({"nodeAffinity": "x"}, "spec.affinity.nodeAffinity"),
        ({"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": {}}}}, "nodeSelectorTerms"),
        ({"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [7]}}}, "nodeSelectorTerms[0]"),
        (
            {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": {}}]}}},
            "matchExpressions",
        ),
    ],
    ids=str,
)
def test_a_malformed_affinity_is_denied_with_400_naming_the_field(
    build, affinity: object, field: str
) -> None:
    review = decide(
        build.review(with_affinity(build, affinity)),
        AdmissionPolicy.from_settings(build.settings()),
    ).review
    status = review["response"]["status"]
    assert review["response"]["allowed"] is False
    assert status["code"] == 400
    assert field in status["message"]
