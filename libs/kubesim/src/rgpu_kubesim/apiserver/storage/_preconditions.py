"""What a write must satisfy before storage commits it, and the pure edits it makes.

These are kube-apiserver's checks on a write, in its words: the request's namespace against
the body's, a delete's or binding's preconditions (uid, resourceVersion), an update's
resourceVersion (optimistic concurrency), a binding's refusals, and a patch applied to the
stored object by its content type. Pure functions over the request and the stored entry; the
write path in `Storage` calls them in kube's order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rgpu_kubesim.machinery import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Entry,
    PatchError,
    Resource,
    full_object,
    invalid_value,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from rgpu_kubesim.machinery import status as _status

JsonObj = dict[str, Any]

_PATCHERS: Mapping[str, Callable[[Any, Any], Any]] = {
    MERGE_PATCH: merge_patch,
    STRATEGIC_PATCH: strategic_merge_patch,
    JSON_PATCH: json_patch,
}


def patched(resource: Resource, current: Entry, patch: object, content_type: str) -> JsonObj:
    """``current`` with ``patch`` applied (not stored); 415 for unknown patch types."""
    patcher = _PATCHERS.get(content_type)
    if patcher is None:
        raise _status.unsupported_media_type(_PATCHERS)
    if content_type != JSON_PATCH and not isinstance(patch, dict):
        raise _status.bad_request(
            "json: cannot unmarshal non-object into Go value of type map[string]interface {}"
        )
    try:
        result = patcher(full_object(resource, current), patch)
    except PatchError as exc:
        raise _status.patch_rejected(str(exc)) from exc
    if not isinstance(result, dict):
        raise _status.patch_rejected("the patched document is not an object")
    return result


def check_version(resource: Resource, body: JsonObj, current: Entry) -> None:
    wanted = body["metadata"].get("resourceVersion")
    if wanted in (None, ""):
        if not resource.unconditional_update:
            cause = invalid_value("metadata.resourceVersion", 0, "must be specified for an update")
            raise _status.invalid_storage(resource, current.name, [cause])
        return
    if str(wanted) != str(current.rv):
        raise _status.modified_conflict(resource, current.name)


def check_namespace(resource: Resource, namespace: str, meta: JsonObj) -> None:
    if not resource.namespaced:
        meta.pop("namespace", None)
        return
    given = meta.get("namespace")
    if given not in (None, "", namespace):
        raise _status.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    meta["namespace"] = namespace


def check_preconditions(resource: Resource, current: Entry, wanted: Mapping[str, Any]) -> None:
    uid, rv = wanted.get("uid"), wanted.get("resourceVersion")
    if uid and uid != current.uid:
        raise _status.precondition_conflict(
            resource, current.namespace, current.name, "UID", uid, current.uid
        )
    if rv and str(rv) != str(current.rv):
        raise _status.precondition_conflict(
            resource, current.namespace, current.name, "ResourceVersion", str(rv), str(current.rv)
        )


def unbindable(pod: JsonObj, name: str) -> str:
    """Why kube's binding storage refuses to assign ``pod`` to a node, or "" (in its order:
    a pending deletion first, then a node already set, then scheduling gates)."""
    if pod["metadata"].get("deletionTimestamp"):
        return f"pod {name} is being deleted, cannot be assigned to a host"
    node = pod["spec"].get("nodeName")
    if node:
        return f'pod {name} is already assigned to node "{node}"'
    if pod["spec"].get("schedulingGates"):
        return f"pod {name} has non-empty .spec.schedulingGates"
    return ""


def set_condition(status: JsonObj, kind: str, now: str) -> None:
    condition = {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
    others = [c for c in status.get("conditions") or () if c.get("type") != kind]
    status["conditions"] = [*others, condition]
