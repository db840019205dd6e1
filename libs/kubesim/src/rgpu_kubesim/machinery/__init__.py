"""The API machinery the simulated cluster shares: the served resources, Status errors,
names, quantities, label and field selectors, field validation, stored entries, patches, CEL,
request routing and the record of refused requests. No storage and no I/O.

Two modules are public because other rooms call them as namespaces: ``status`` (one builder per
kube-apiserver error) and ``validation`` (field causes). Importers bind them to ``_status`` and
``_validation``: ``status`` is also a common local name, and a private name is not re-exported.
"""

from __future__ import annotations

from rgpu_kubesim.machinery._cel import (
    ConditionError,
    EvaluationError,
    MatchCondition,
    compile_condition,
    compile_conditions,
    context_of,
    evaluate,
    match_condition_causes,
    value_of,
)
from rgpu_kubesim.machinery._names import (
    label_value_error,
    qualified_name_error,
)
from rgpu_kubesim.machinery._objects import (
    Entry,
    Key,
    copy_object,
    full_bytes,
    full_object,
    make_entry,
    ordered,
    timestamp,
    with_resource_version,
)
from rgpu_kubesim.machinery._patching import (
    JSON_PATCH,
    MERGE_PATCH,
    PATCH_TYPES,
    STRATEGIC_PATCH,
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from rgpu_kubesim.machinery._quantity import (
    parse_quantity,
)
from rgpu_kubesim.machinery._refusals import (
    Refusal,
    Refusals,
)
from rgpu_kubesim.machinery._resources import (
    RESOURCES,
    SUBRESOURCE_KINDS,
    VERBS,
    Resource,
    by_plural,
    group_versions,
    in_group_version,
    require,
)
from rgpu_kubesim.machinery._routing import (
    Target,
    parse_target,
    verb_for,
)
from rgpu_kubesim.machinery._selectors import (
    Filter,
    LabelSelector,
    labels_match,
    parse_filter,
    selector_from_object,
)
from rgpu_kubesim.machinery.status import Cause
from rgpu_kubesim.machinery.validation import (
    duplicate,
    forbidden,
    invalid_value,
    not_supported,
    required,
)

__all__ = [
    "JSON_PATCH",
    "MERGE_PATCH",
    "PATCH_TYPES",
    "RESOURCES",
    "STRATEGIC_PATCH",
    "SUBRESOURCE_KINDS",
    "VERBS",
    "Cause",
    "ConditionError",
    "Entry",
    "EvaluationError",
    "Filter",
    "Key",
    "LabelSelector",
    "MatchCondition",
    "PatchError",
    "Refusal",
    "Refusals",
    "Resource",
    "Target",
    "by_plural",
    "compile_condition",
    "compile_conditions",
    "context_of",
    "copy_object",
    "duplicate",
    "evaluate",
    "forbidden",
    "full_bytes",
    "full_object",
    "group_versions",
    "in_group_version",
    "invalid_value",
    "json_patch",
    "label_value_error",
    "labels_match",
    "make_entry",
    "match_condition_causes",
    "merge_patch",
    "not_supported",
    "ordered",
    "parse_filter",
    "parse_quantity",
    "parse_target",
    "qualified_name_error",
    "require",
    "required",
    "selector_from_object",
    "strategic_merge_patch",
    "timestamp",
    "value_of",
    "verb_for",
    "with_resource_version",
]
