"""Query options kube-apiserver validates before it touches storage.

List, watch and write requests carry options (resourceVersionMatch, sendInitialEvents, dryRun,
fieldValidation) whose combinations the real server checks up front and refuses with a 422
naming the options kind (``ListOptions.meta.k8s.io "" is invalid: ...``). Clients depend on
those refusals to detect what a server supports, so the simulator gives the same answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from starlette.datastructures import QueryParams

from rgpu_kubesim.machinery import Cause, forbidden
from rgpu_kubesim.machinery import status as _status

EXACT, NOT_OLDER_THAN = "Exact", "NotOlderThan"
FIELD_VALIDATION = ("Ignore", "Strict", "Warn")
_OPTION_KINDS = {
    "create": "CreateOptions",
    "update": "UpdateOptions",
    "patch": "PatchOptions",
    "delete": "DeleteOptions",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteOptions:
    """What a write asked for besides its body."""

    dry_run: bool = False
    field_validation: str = "Warn"


def _refuse(kind: str, causes: list[Cause]) -> None:
    if causes:
        details = {"group": "meta.k8s.io", "kind": kind}
        raise _status.invalid(f"{kind}.meta.k8s.io", "", causes, details)


def _unsupported(field: str, shown: str, allowed: tuple[str, ...]) -> Cause:
    options = ", ".join(f'"{a}"' for a in allowed)
    detail = f"Unsupported value: {shown}: supported values: {options}"
    return Cause(field=field, reason="FieldValueNotSupported", detail=detail)


def check_list(query: Mapping[str, str]) -> None:
    """ListOptions rules for a plain list (kube's ValidateListOptions)."""
    match, causes = query.get("resourceVersionMatch", ""), []
    if match:
        if not query.get("resourceVersion"):
            causes.append(
                forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            )
        if query.get("continue"):
            causes.append(_continue_forbidden())
        if match not in (EXACT, NOT_OLDER_THAN):
            causes.append(
                _unsupported("resourceVersionMatch", f'"{match}"', (EXACT, NOT_OLDER_THAN, ""))
            )
        if match == EXACT and query.get("resourceVersion") == "0":
            causes.append(
                forbidden(
                    "resourceVersionMatch",
                    'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                )
            )
    if "sendInitialEvents" in query:
        causes.append(forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
    _refuse("ListOptions", causes)


def _continue_forbidden() -> Cause:
    return forbidden(
        "resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided"
    )


def check_watch(query: Mapping[str, str]) -> bool:
    """ListOptions rules for a watch; True when the client asked for a streaming list."""
    match, causes = query.get("resourceVersionMatch", ""), []
    asked = "sendInitialEvents" in query
    if asked and match != NOT_OLDER_THAN:
        causes.append(
            forbidden(
                "resourceVersionMatch",
                f"sendInitialEvents requires setting resourceVersionMatch to {NOT_OLDER_THAN}",
            )
        )
    if match:
        if not asked:
            causes.append(
                forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is "
                    "provided",
                )
            )
        if match != NOT_OLDER_THAN:
            causes.append(_unsupported("resourceVersionMatch", f'"{match}"', (NOT_OLDER_THAN,)))
        if query.get("continue"):
            causes.append(_continue_forbidden())
    _refuse("ListOptions", causes)
    streaming = asked and _boolean(query, "sendInitialEvents")
    if streaming and not _boolean(query, "allowWatchBookmarks"):
        # The end of the initial events is only signalled by a bookmark.
        raise _status.bad_request(
            "sendInitialEvents=true requires allowWatchBookmarks=true: the end of the initial "
            "events is announced by a BOOKMARK"
        )
    return streaming


def _boolean(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name, "")
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("", "false", "0"):
        return False
    raise _status.bad_request(f"{name} must be a boolean, got {value!r}")


def write_options(verb: str, query: QueryParams, body_dry_run: object = None) -> WriteOptions:
    """dryRun and fieldValidation of a write; 422 for values kube does not support.

    ``body_dry_run`` is a DeleteOptions body's ``dryRun`` (kubectl sends it there).
    """
    kind, causes = _OPTION_KINDS[verb], []
    from_body = body_dry_run if isinstance(body_dry_run, list) else []
    values = [str(v) for v in [*query.getlist("dryRun"), *from_body] if v]
    if any(v != "All" for v in values):
        shown = "[" + ",".join(f'"{v}"' for v in values) + "]"
        causes.append(_unsupported("dryRun", shown, ("All",)))
    validation = query.get("fieldValidation", "") or "Warn"
    if verb != "delete" and validation not in FIELD_VALIDATION:
        causes.append(_unsupported("fieldValidation", f'"{validation}"', ("", *FIELD_VALIDATION)))
    _refuse(kind, causes)
    return WriteOptions(dry_run=bool(values), field_validation=validation)
