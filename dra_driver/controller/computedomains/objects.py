"""What the controller creates for one ComputeDomain, as wire-form JSON (resource.k8s.io/v1, apps/v1). Pure.

    in the domain's namespace   ResourceClaimTemplate spec.channel.resourceClaimTemplate.name (request `channel`,
                                class compute-domain-default-channel.gpu.dra.dev, opaque ComputeDomainChannelConfig)
    in the driver's namespace   ResourceClaimTemplate computedomain-daemon-<uid> (request `daemon`, class
                                compute-domain-daemon.gpu.dra.dev, opaque ComputeDomainDaemonConfig) and the
                                DaemonSet computedomain-daemon-<uid> (node selector gpu.dra.dev/computeDomain=<uid>)

Every object carries the label `gpu.dra.dev/computeDomain=<uid>` (how deletion finds them and people see whose) and
the template label `gpu.dra.dev/computeDomainTarget`. The workload template is owned by the domain (same namespace:
an ownerReference is valid and the garbage collector is a second line); objects in the driver's namespace cannot
be (Kubernetes refuses cross-namespace owners), so the label is what ties them to it. Both templates carry the
domain finalizer: a user's `kubectl delete resourceclaimtemplate` cannot pull the template from under a running
domain; the controller removes the finalizer when the domain goes.

resource.k8s.io/v1 serves ResourceClaimTemplates on every supported release (1.34-1.37), so no version is
discovered here (docs/reference/api-requests.md).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Final

from dra_driver.computedomain import names
from dra_driver.computedomain.model import ComputeDomain

JsonObject = dict[str, Any]

CHANNEL_REQUEST: Final = "channel"
DAEMON_REQUEST: Final = "daemon"
DAEMON_CONTAINER: Final = "imex-daemon"
# The pod template's digest, so an upgraded controller (a new image, new probes) rolls the DaemonSet.
TEMPLATE_HASH_ANNOTATION: Final = f"{names.API_GROUP}/template-hash"
MANAGED_BY: Final = "dra-driver-controller"


@dataclass(frozen=True)
class DaemonSetSettings:
    """How the daemon pods are made (the controller's flags)."""

    namespace: str  # the driver's namespace
    image: str
    image_pull_policy: str = "IfNotPresent"
    service_account: str = ""  # "" : the namespace's default account
    max_nodes_per_imex_domain: int = names.MAX_NODES_PER_IMEX_DOMAIN
    priority_class_name: str = ""


def _labels(domain: ComputeDomain, target: str) -> dict[str, str]:
    return {
        names.DOMAIN_LABEL: domain.uid,
        names.TARGET_LABEL: target,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def _opaque(kind: str, request: str, parameters: JsonObject) -> JsonObject:
    return {
        "requests": [request],
        "opaque": {
            "driver": names.DRIVER_NAME,
            "parameters": {"apiVersion": names.GROUP_VERSION, "kind": kind, **parameters},
        },
    }


def owner_reference(domain: ComputeDomain) -> JsonObject:
    return {
        "apiVersion": names.GROUP_VERSION,
        "kind": names.COMPUTE_DOMAIN_KIND,
        "name": domain.name,
        "uid": domain.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def workload_claim_template(domain: ComputeDomain) -> JsonObject:
    """The template the domain's workload pods name: one channel of this domain per pod (NVIDIA's shape)."""
    labels = _labels(domain, names.TARGET_WORKLOAD)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": domain.claim_template_name,
            "namespace": domain.namespace,
            "labels": labels,
            "finalizers": [names.DOMAIN_FINALIZER],
            "ownerReferences": [owner_reference(domain)],
        },
        "spec": {
            "metadata": {"labels": {names.DOMAIN_LABEL: domain.uid, names.TARGET_LABEL: names.TARGET_WORKLOAD}},
            "spec": {
                "devices": {
                    "requests": [{"name": CHANNEL_REQUEST,
                                  "exactly": {"deviceClassName": names.DEFAULT_CHANNEL_CLASS}}],
                    "config": [_opaque(names.CHANNEL_CONFIG_KIND, CHANNEL_REQUEST, {
                        "domainID": domain.uid, "allocationMode": domain.allocation_mode.value})],
                },
            },
        },
    }


def daemon_claim_template(domain: ComputeDomain, settings: DaemonSetSettings) -> JsonObject:
    """The daemon pods' claim: the node's daemon device, configured for this domain (CDI adds CLIQUE_ID,
    COMPUTE_DOMAIN_UUID/NAME/NAMESPACE and the /imexd mount)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": names.daemon_object_name(domain.uid),
            "namespace": settings.namespace,
            "labels": _labels(domain, names.TARGET_DAEMON),
            "finalizers": [names.DOMAIN_FINALIZER],
        },
        "spec": {
            "metadata": {"labels": {names.DOMAIN_LABEL: domain.uid, names.TARGET_LABEL: names.TARGET_DAEMON}},
            "spec": {
                "devices": {
                    "requests": [{"name": DAEMON_REQUEST, "exactly": {"deviceClassName": names.DAEMON_CLASS}}],
                    "config": [_opaque(names.DAEMON_CONFIG_KIND, DAEMON_REQUEST, {"domainID": domain.uid})],
                },
            },
        },
    }


def _field_env(name: str, path: str) -> JsonObject:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _probe(args: list[str], *, period: int, failures: int) -> JsonObject:
    return {"exec": {"command": args}, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 10}


def daemon_pod_template(domain: ComputeDomain, settings: DaemonSetSettings) -> JsonObject:
    """The IMEX daemon's pod (the contract in docs/compute-domains.md "The daemon pod")."""
    check = ["dra-driver", "compute-domain-daemon", "check", "--config-dir", names.DAEMON_CONFIG_MOUNT]
    labels = {names.DOMAIN_LABEL: domain.uid, "app.kubernetes.io/name": "compute-domain-daemon",
              "app.kubernetes.io/managed-by": MANAGED_BY}
    container: JsonObject = {
        "name": DAEMON_CONTAINER,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["dra-driver", "compute-domain-daemon", "run", "--config-dir", names.DAEMON_CONFIG_MOUNT],
        "env": [
            _field_env("NODE_NAME", "spec.nodeName"),
            _field_env("POD_IP", "status.podIP"),
            _field_env("POD_NAME", "metadata.name"),
            _field_env("POD_NAMESPACE", "metadata.namespace"),
            _field_env("POD_UID", "metadata.uid"),
            {"name": names.ENV_MAX_NODES, "value": str(settings.max_nodes_per_imex_domain)},
            # The node's default runtime may be NVIDIA's: do not let it hand every GPU to the daemon.
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        ],
        "resources": {"claims": [{"name": DAEMON_REQUEST}]},
        # NVIDIA's timings: IMEX may take long to reach quorum the first time (20 minutes of startup), then a
        # daemon that stops answering for 20 minutes is restarted; readiness follows every 10 s.
        "startupProbe": _probe(check, period=1, failures=1200),
        "livenessProbe": _probe(check, period=60, failures=20),
        "readinessProbe": _probe(check, period=10, failures=1),
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    spec: JsonObject = {
        "nodeSelector": {names.DOMAIN_LABEL: domain.uid},
        # The daemon must run wherever a workload of the domain runs, whatever the node's taints.
        "tolerations": [{"operator": "Exists"}],
        "resourceClaims": [{"name": DAEMON_REQUEST, "resourceClaimTemplateName": names.daemon_object_name(domain.uid)}],
        "containers": [container],
        "terminationGracePeriodSeconds": 30,
    }
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    if settings.priority_class_name:
        spec["priorityClassName"] = settings.priority_class_name
    return {"metadata": {"labels": labels}, "spec": spec}


def template_hash(template: JsonObject) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def daemon_set(domain: ComputeDomain, settings: DaemonSetSettings) -> JsonObject:
    template = daemon_pod_template(domain, settings)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": names.daemon_object_name(domain.uid),
            "namespace": settings.namespace,
            "labels": {names.DOMAIN_LABEL: domain.uid, "app.kubernetes.io/managed-by": MANAGED_BY},
            "annotations": {TEMPLATE_HASH_ANNOTATION: template_hash(template),
                            f"{names.API_GROUP}/computeDomain.name": f"{domain.namespace}/{domain.name}"},
        },
        "spec": {
            "selector": {"matchLabels": {names.DOMAIN_LABEL: domain.uid}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": template,
        },
    }


def labelled_for(obj: JsonObject, uid: str) -> bool:
    """The object is one this controller made for the domain `uid`."""
    return ((obj.get("metadata") or {}).get("labels") or {}).get(names.DOMAIN_LABEL) == uid
