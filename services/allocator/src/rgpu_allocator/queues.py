"""Operators set namespace quotas and fair-share weights in a ConfigMap (``rgpu-queues`` in the
system namespace, key ``queues.yaml``) and expect a change to take effect at once, on every
replica, and a mistake to be refused loudly rather than read as "no limit". So the ConfigMap
is watched (the runtime's reflector: list, watch, relist on 410), each version is checked
whole (``rgpu_placement.QueueConfig``), and a version that cannot be used keeps the last good
configuration in force, with a Warning Event on the ConfigMap, a log line and
``rgpu_queue_config_errors_total``. A deleted ConfigMap means no queues (no quota, weight 1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily, Metric

from rgpu_placement import MAX_CONFIG_BYTES, NO_QUEUES, QueueConfig, QueueConfigError
from rgpu_runtime.kube import KubeEvent, ObjectChange, ObjectRef, Reflector

from .clients import QUEUES_CONFIG, KubeApi

__all__ = ["CONFIG_KEY", "CONFIG_NAME", "Queues", "parse_queues", "queues_reflector"]

logger = logging.getLogger(__name__)

CONFIG_NAME = QUEUES_CONFIG
CONFIG_KEY = "queues.yaml"
BAD_CONFIG = "RemoteGPUQueuesInvalid"
"""The Event reason on a ConfigMap whose queues cannot be used."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Version:
    """One version of the ConfigMap as the watch delivered it."""

    uid: str
    resource_version: str
    text: str | None
    """The ``queues.yaml`` value; ``None`` when the key is missing."""


def _version(raw: Mapping[str, Any]) -> Version | None:
    meta = raw.get("metadata") or {}
    if meta.get("name") != CONFIG_NAME:
        return None
    data = raw.get("data") or {}
    text = data.get(CONFIG_KEY)
    return Version(
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        text=text if isinstance(text, str) else None,
    )


def parse_queues(text: str | None) -> QueueConfig:
    """The configuration ``text`` describes; raises ``QueueConfigError`` saying what is wrong.
    A missing key or an empty document means no queues."""
    if text is None or not text.strip():
        return NO_QUEUES
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise QueueConfigError(
            CONFIG_KEY, f"{len(text.encode())} bytes, more than the {MAX_CONFIG_BYTES} allowed"
        )
    try:
        raw = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise QueueConfigError(CONFIG_KEY, f"not YAML: {str(exc)[:200]}") from exc
    return QueueConfig.from_mapping(raw)


class Queues:
    """The queue configuration in force, and what went wrong with the last bad one."""

    __slots__ = ("_api", "_changed", "_errors", "_namespace", "_said", "config", "problem")

    def __init__(
        self,
        *,
        api: KubeApi,
        registry: CollectorRegistry,
        changed: Callable[[], None],
        namespace: str,
    ) -> None:
        self._api, self._changed, self._namespace = api, changed, namespace
        self.config: QueueConfig = NO_QUEUES
        self.problem: str | None = None
        """Why the newest version was refused (the last good one is in force); ``None`` when
        the newest version is the one in force."""
        self._said: str | None = None
        self._errors = PromCounter(
            "rgpu_queue_config_errors",
            f"Versions of ConfigMap {CONFIG_NAME} refused (the last good one stays in force).",
            registry=registry,
        )

    def changed(self, change: ObjectChange[Version]) -> None:
        """Reflector listener: take a new version, or keep the last good one."""
        version = change.after
        if version is None:
            self._use(NO_QUEUES, "ConfigMap deleted: no queues (no quota, weight 1)")
            return
        try:
            config = parse_queues(version.text)
        except QueueConfigError as exc:
            self._refuse(version, str(exc))
            return
        self._use(config, f"version {version.resource_version} in force")

    def _use(self, config: QueueConfig, why: str) -> None:
        self.problem = None
        if config != self.config:
            self.config = config
            logger.info("queues: %s", why)
            self._changed()

    def _refuse(self, version: Version, problem: str) -> None:
        self.problem = problem
        self._errors.inc()
        logger.warning(
            "ConfigMap %s/%s version %s refused, the last good queues stay in force: %s",
            self._namespace,
            CONFIG_NAME,
            version.resource_version,
            problem,
        )
        if self._said == version.resource_version:
            return
        self._said = version.resource_version
        regarding = ObjectRef(
            kind="ConfigMap", name=CONFIG_NAME, namespace=self._namespace, uid=version.uid
        )
        message = (
            f"{CONFIG_KEY} refused, the last good queues stay in force: {problem}; fix the "
            "document (docs/queues.md has the format)"
        )
        self._api.record_event(
            KubeEvent(regarding=regarding, reason=BAD_CONFIG, message=message, warning=True)
        )

    def quotas(self, held: Mapping[str, int], leading: bool) -> Iterator[Metric]:
        """``rgpu_namespace_cards_held`` and ``rgpu_namespace_cards_quota`` (leader only)."""
        held_family = GaugeMetricFamily(
            "rgpu_namespace_cards_held",
            "Cards held or admitted by the pods of a namespace (claims in Leases).",
            labels=["namespace"],
        )
        quota_family = GaugeMetricFamily(
            "rgpu_namespace_cards_quota",
            f"A namespace's card quota from ConfigMap {CONFIG_NAME} (listed or holding ones).",
            labels=["namespace"],
        )
        if leading:
            for namespace in sorted({*held, *self.config.namespaces}):
                held_family.add_metric([namespace], held.get(namespace, 0))
                cards = self.config.quota(namespace).cards
                if cards is not None:
                    quota_family.add_metric([namespace], cards)
        yield held_family
        yield quota_family


def queues_reflector(api: KubeApi, queues: Queues) -> Reflector[Version]:
    """The reflector following ``rgpu-queues`` in the system namespace into ``queues``."""
    return Reflector[Version](
        name="queues",
        list_pages=api.queue_config_pages,
        watch=api.watch_queue_config,
        transform=_version,
        on_change=queues.changed,
    )
