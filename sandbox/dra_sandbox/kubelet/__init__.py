"""Kubelet simulator: plugin watcher, registration, DRA gRPC client, health stream and pod lifecycle.

Each part is usable and testable alone: `PluginWatcher` (inotify/polling), `PluginSession` /
`PluginManager` (registration, GetInfo polling, health), `DraClient` (NodePrepare/Unprepare),
`lifecycle` (pure decisions), `PodSync` (pods against the API server). `KubeletSimulator` ties them
together; `run_kubelet` is the entry point for a CLI.
"""

from dra_sandbox.kubelet.clock import Backoff, Clock, RealClock
from dra_sandbox.kubelet.draclient import ClaimRef, DraClient, PreparedDevice, PrepareResult
from dra_sandbox.kubelet.health import DeviceHealth, HealthStore
from dra_sandbox.kubelet.podsync import CONTAINERS_ANNOTATION, PodSync, PodSyncConfig
from dra_sandbox.kubelet.registration import (
    PluginManager,
    PluginSession,
    PluginStore,
    RegisteredPlugin,
    RegistrationConfig,
)
from dra_sandbox.kubelet.simulator import KubeletConfig, KubeletSimulator, run_kubelet
from dra_sandbox.kubelet.watcher import PluginWatcher

__all__ = [
    "CONTAINERS_ANNOTATION",
    "Backoff",
    "ClaimRef",
    "Clock",
    "DeviceHealth",
    "DraClient",
    "HealthStore",
    "KubeletConfig",
    "KubeletSimulator",
    "PluginManager",
    "PluginSession",
    "PluginStore",
    "PluginWatcher",
    "PodSync",
    "PodSyncConfig",
    "PrepareResult",
    "PreparedDevice",
    "RealClock",
    "RegisteredPlugin",
    "RegistrationConfig",
    "run_kubelet",
]
