"""What a multi-node Kubernetes job asks for beyond GPUs: its RDMA devices.

A pod gets a cluster's RDMA NICs only by requesting the extended resource the RDMA device plugin exposes
(``rdma/ib``, ``nvidia.com/hostdev``, ...: named by the cluster, so the recipe names it). Without it NCCL falls
back to TCP sockets across nodes and DeepEP/HybridEP's internode paths cannot run; LAU002 says so.
"""

from __future__ import annotations

from mocompile.ir import Decision, Plan


def rdma_decision(plan: Plan) -> Decision:
    launch = plan.intent.get("launch") or {}
    k8s = launch.get("kubernetes") or {}
    if "kubernetes" not in (launch.get("targets") or []):
        return Decision(None, "derived", "no Kubernetes target")
    resource = k8s.get("rdma_resource")
    if not resource:
        return Decision(None, "default", "launch.kubernetes.rdma_resource unset: pods request no RDMA device")
    if plan.hardware["nodes"] <= 1:
        return Decision(None, "derived", "one node: NVLink only, no RDMA device needed")
    return Decision([resource, int(k8s.get("rdma_per_pod", 1))], "user",
                    "each pod requests the RDMA NICs the cluster's device plugin exposes (launch.kubernetes)")
