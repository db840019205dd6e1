"""Kubernetes name grammars (RFC 1123 names, path segments, qualified label keys, label values).

Object names, namespaces, label keys and label values each have their own grammar and their own
error message in apimachinery; selectors and validation both need them, so they live here once.
Each checker returns None when the value is valid, else kube's explanation.
"""

from __future__ import annotations

import re

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")

_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    r"for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_QUALIFIED_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def dns_subdomain_error(value: str) -> str | None:
    if len(value) > 253:
        return "must be no more than 253 characters"
    return None if _DNS_SUBDOMAIN.match(value) else _SUBDOMAIN_MSG


def dns_label_error(value: str) -> str | None:
    if len(value) > 63:
        return "must be no more than 63 characters"
    return None if _DNS_LABEL.match(value) else _LABEL_MSG


def qualified_name_error(value: str) -> str | None:
    """Label/annotation key grammar: optional DNS-subdomain prefix, '/', then a name part."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or dns_subdomain_error(prefix)):
        return "prefix part " + (dns_subdomain_error(prefix) or "must be non-empty")
    if not name:
        return "name part must be non-empty"
    if len(name) > 63:
        return "name part must be no more than 63 characters"
    return None if _QUALIFIED_NAME.match(name) else _QUALIFIED_MSG


def path_segment_error(value: str) -> str | None:
    """The grammar of RBAC object names (``system:basic-user``): anything that is one URL path
    segment."""
    if value in (".", ".."):
        return f"may not be '{value}'"
    for banned in ("/", "%"):
        if banned in value:
            return f"may not contain '{banned}'"
    return None


def label_value_error(value: str) -> str | None:
    if len(value) > 63:
        return "must be no more than 63 characters"
    return None if _LABEL_VALUE.match(value) else _VALUE_MSG
