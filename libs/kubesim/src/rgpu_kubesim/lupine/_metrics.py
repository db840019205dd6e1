"""Discovery decides which cards are busy by reading lupine's
``/metrics``, so the fake must render exactly the families, label sets and order a real server
writes (see ``fixtures/lupine/metrics-sample.txt``), computed from the fake's current state.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

from rgpu_kubesim.lupine._state import LupineClient, LupineGpu, LupineState

__all__ = ["CONTENT_TYPE", "render_metrics"]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

_Labels = tuple[tuple[str, str], ...]

_HELP: Final[dict[str, str]] = {
    "lupine_monitor_nvml_up": "Whether NVML is available to the monitor.",
    "lupine_host_gpu_memory_total_bytes": "Total memory of each GPU.",
    "lupine_host_gpu_memory_used_bytes": "Used memory of each GPU.",
    "lupine_server_connection_info": "One line per live client connection.",
    "lupine_client_device_memory_used_bytes": "Memory a client holds on a GPU.",
    "lupine_client_device_utilization_percent": "SM utilisation of a client on a GPU.",
}

# Each client shows one connection per kind, as a real CUDA process opens both.
_CONNECTION_KINDS: Final = ("cuda", "nvml")


def render_metrics(state: LupineState) -> str:
    """Render the Prometheus text exposition of ``state`` (once per change of its clients:
    discovery probes every server every few seconds, and most of them changed nothing)."""
    cached = state.rendered
    if cached is not None and cached[0] == state.revision:
        return cached[1]
    text = _render(state)
    state.rendered = (state.revision, text)
    return text


def _render(state: LupineState) -> str:
    clients = tuple(state.clients.values())
    families = (
        ("lupine_monitor_nvml_up", (((), 1),)),
        ("lupine_host_gpu_memory_total_bytes", _gpu_totals(state.gpus)),
        ("lupine_host_gpu_memory_used_bytes", _gpu_used(state.gpus, clients)),
        ("lupine_server_connection_info", _connections(clients)),
        ("lupine_client_device_memory_used_bytes", _usage(state, clients, memory=True)),
        ("lupine_client_device_utilization_percent", _usage(state, clients, memory=False)),
    )
    return "".join(_family(name, samples) for name, samples in families)


def _family(name: str, samples: Iterable[tuple[_Labels, int]]) -> str:
    head = f"# HELP {name} {_HELP[name]}\n# TYPE {name} gauge\n"
    return head + "".join(f"{name}{_labels(labels)} {value}\n" for labels, value in samples)


def _labels(labels: _Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _gpu_labels(gpu: LupineGpu) -> _Labels:
    return (
        ("device_index", str(gpu.index)),
        ("device_type", gpu.device_type),
        ("device_uuid", gpu.uuid),
    )


def _gpu_totals(gpus: Iterable[LupineGpu]) -> Iterator[tuple[_Labels, int]]:
    for gpu in gpus:
        yield _gpu_labels(gpu), gpu.memory_bytes


def _gpu_used(
    gpus: Iterable[LupineGpu], clients: tuple[LupineClient, ...]
) -> Iterator[tuple[_Labels, int]]:
    for gpu in gpus:
        used = sum(c.memory_bytes for c in clients if gpu.uuid in c.gpu_uuids)
        yield _gpu_labels(gpu), min(used, gpu.memory_bytes)


def _client_labels(client: LupineClient) -> _Labels:
    return (
        ("client_id", client.client_id),
        ("client_address", client.address),
        ("client_hostname", client.hostname),
        ("client_name", client.name),
    )


def _connections(clients: Iterable[LupineClient]) -> Iterator[tuple[_Labels, int]]:
    for client in clients:
        for offset, kind in enumerate(_CONNECTION_KINDS):
            pids = (
                ("client_pid", str(client.pid)),
                ("connection_kind", kind),
                ("host_pid", str(90000 + 2 * client.serial + offset)),
                ("server_pid", str(300 + 2 * client.serial + offset)),
            )
            yield _client_labels(client) + pids, 1


def _usage(
    state: LupineState, clients: Iterable[LupineClient], *, memory: bool
) -> Iterator[tuple[_Labels, int]]:
    for client in clients:
        for uuid in client.gpu_uuids:
            gpu = state.gpu(uuid)
            index = str(gpu.index) if gpu is not None else ""
            labels = (*_client_labels(client), ("device_uuid", uuid), ("device_index", index))
            yield labels, client.memory_bytes if memory else client.utilization_percent
