"""How Kueue's own manifests are installed on the sandbox (batchsched.sandbox.kueue): its
webhooks reached through its Service on the port it listens on, those on pods and
workloads limited to the namespaces that ask for Kueue, its CRDs converted by its webhook."""

from __future__ import annotations

from pathlib import Path

import yaml

from batchsched.sandbox import kueue

WEBHOOKS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
- name: mclusterqueue.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-cq}}
  rules: [{apiGroups: [kueue.x-k8s.io], apiVersions: [v1beta2], operations: [CREATE], resources: [clusterqueues]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validating-webhook-configuration}
webhooks:
- name: vjob.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate-batch-v1-job}}
  rules: [{apiGroups: [batch], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [jobs]}]
"""


def crd(plural: str) -> dict[str, object]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.kueue.x-k8s.io"},
            "spec": {"group": "kueue.x-k8s.io", "names": {"plural": plural}}}


def source(tmp_path: Path) -> Path:
    (tmp_path / kueue.WEBHOOK_MANIFEST).parent.mkdir(parents=True)
    (tmp_path / kueue.WEBHOOK_MANIFEST).write_text(WEBHOOKS)
    (tmp_path / kueue.CRD_FOLDER).mkdir(parents=True)
    for plural in ("workloads", "resourceflavors"):
        (tmp_path / kueue.CRD_FOLDER / f"kueue.x-k8s.io_{plural}.yaml").write_text(yaml.safe_dump(crd(plural)))
    return tmp_path


def test_webhooks_are_named_as_installed_and_reach_the_service_port(tmp_path: Path) -> None:
    docs = {d["kind"]: d for d in kueue.webhook_documents(source(tmp_path), 19443)}
    assert docs["MutatingWebhookConfiguration"]["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    assert docs["ValidatingWebhookConfiguration"]["metadata"]["name"] == "kueue-validating-webhook-configuration"
    for doc in docs.values():
        for hook in doc["webhooks"]:
            assert hook["clientConfig"]["service"] == {
                "name": kueue.SERVICE, "namespace": kueue.NAMESPACE, "port": 19443,
                "path": hook["clientConfig"]["service"]["path"]}


def test_only_webhooks_on_pods_and_workloads_are_limited_to_labelled_namespaces(tmp_path: Path) -> None:
    hooks = {h["name"]: h for d in kueue.webhook_documents(source(tmp_path), 1) for h in d["webhooks"]}
    selector = {"matchExpressions": [{"key": kueue.NAMESPACE_LABEL, "operator": "Exists"}]}
    assert hooks["mpod.kb.io"]["namespaceSelector"] == selector
    assert hooks["vjob.kb.io"]["namespaceSelector"] == selector
    assert "namespaceSelector" not in hooks["mclusterqueue.kb.io"]  # cluster-scoped queues: every request


def test_converted_crds_go_through_the_webhook_and_the_rest_are_untouched(tmp_path: Path) -> None:
    crds = {c["spec"]["names"]["plural"]: c for c in kueue.crd_documents(source(tmp_path), 19443)}
    conversion = crds["workloads"]["spec"]["conversion"]
    assert conversion["strategy"] == "Webhook"
    assert conversion["webhook"]["clientConfig"]["service"] == {
        "namespace": kueue.NAMESPACE, "name": kueue.SERVICE, "path": "/convert", "port": 19443}
    assert "conversion" not in crds["resourceflavors"]["spec"]


def test_configuration_listens_on_loopback_and_manages_only_labelled_namespaces(tmp_path: Path) -> None:
    cfg = kueue.configuration(webhook_port=1, probe_port=2, metrics_port=3, cert_dir=tmp_path)
    assert cfg["webhook"] == {"port": 1, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:2"
    assert cfg["metrics"]["bindAddress"] == "127.0.0.1:3"
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["managedJobsNamespaceSelector"]["matchExpressions"][0]["key"] == kueue.NAMESPACE_LABEL
    assert cfg["internalCertManagement"]["webhookServiceName"] == kueue.SERVICE
