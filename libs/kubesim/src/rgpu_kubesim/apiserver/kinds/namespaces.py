"""Namespace deletion as kube does it: Terminating first, removed once emptied and finalized.

DELETE of a namespace does not remove it: the registry stamps ``deletionTimestamp`` and
``status.phase: Terminating``, the NamespaceLifecycle admission plugin refuses new content in
it, and the namespace controller deletes what is inside, clears the ``kubernetes`` finalizer
from ``spec.finalizers`` and lets the namespace go once no finalizer is left. Clients that
recreate a namespace right after deleting it have to cope with that window, so the simulator
keeps it (``ApiOptions.namespace_finalize_seconds`` long).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import anyio
from anyio.abc import TaskStatus

from rgpu_kubesim.errors import ApiError
from rgpu_kubesim.machinery import Entry, Resource
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]
TERMINATING = "Terminating"


def is_terminating(namespace: Entry | None) -> bool:
    return namespace is not None and b'"deletionTimestamp"' in namespace.body


def terminating(namespace: JsonObj, now: str) -> JsonObj:
    """The namespace as DELETE leaves it (a new dict; ``namespace`` is not changed)."""
    meta = {**namespace["metadata"], "deletionTimestamp": now, "deletionGracePeriodSeconds": 0}
    status = {**(namespace.get("status") or {}), "phase": TERMINATING}
    return {**namespace, "metadata": meta, "status": status}


def finalized(namespace: JsonObj) -> JsonObj:
    """The namespace once the controller has removed its ``kubernetes`` finalizer."""
    spec = {k: v for k, v in (namespace.get("spec") or {}).items() if k != "finalizers"}
    return {**namespace, "spec": spec}


def releasable(namespace: Mapping[str, Any]) -> bool:
    """A terminating namespace with no finalizer left is removed."""
    meta = namespace.get("metadata") or {}
    spec = namespace.get("spec") or {}
    return bool(meta.get("deletionTimestamp")) and not (
        meta.get("finalizers") or spec.get("finalizers")
    )


def being_terminated(resource: Resource, name: str, namespace: str) -> ApiError:
    """NamespaceLifecycle's refusal of new content in a terminating namespace."""
    message = (
        f'{resource.qualified} "{name}" is forbidden: unable to create new content in namespace '
        f"{namespace} because it is being terminated"
    )
    cause = {
        "reason": "NamespaceTerminating",
        "message": f"namespace {namespace} is being terminated",
        "field": "metadata.namespace",
    }
    details = _status.resource_details(resource, name, causes=[cause])
    return _status.failure(403, message, details=details)


def already_terminating(resource: Resource, name: str) -> ApiError:
    why = (
        "The system is ensuring all content is removed from this namespace.  Upon completion, "
        "this namespace will automatically be purged by the system."
    )
    return _status.conflict(resource, name, why)


class Finalizing(Protocol):
    def finalize_namespaces(self) -> None: ...


async def run_controller(
    storage: Finalizing,
    interval: float,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """The namespace controller: every ``interval`` seconds, finish terminating namespaces."""
    task_status.started()
    while True:
        await anyio.sleep(max(interval, 0.01))  # 0 would spin
        storage.finalize_namespaces()
