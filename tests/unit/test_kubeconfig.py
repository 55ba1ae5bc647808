"""Credentials read without kubernetes-asyncio equal what kubernetes-asyncio reads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as kclient
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

from batchsched.kube.client import Credentials, _credentials, load_credentials, loaded_credentials
from batchsched.kube.kubeconfig import plain_in_cluster, plain_kubeconfig


def _kubeconfig(folder: Path, cluster: dict[str, Any], user: dict[str, Any], *, other: bool = False) -> str:
    for name in ("ca.crt", "client.crt", "client.key", "token"):
        (folder / name).write_text(f"{name} of {folder.name}\n")
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "main", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "main",
    }
    if other:  # the current context is another one, naming a cluster of its own
        doc["clusters"].append({"name": "elsewhere", "cluster": {"server": "https://10.0.0.9:6443"}})
        doc["contexts"].append({"name": "other", "context": {"cluster": "elsewhere", "user": "u"}})
        doc["current-context"] = "other"
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


PLAIN = [
    ({"server": "https://127.0.0.1:6443/", "certificate-authority": "ca.crt"}, {"token": "abc"}),
    ({"server": "https://127.0.0.1:6443", "certificate-authority": "ca.crt"}, {"tokenFile": "token"}),
    ({"server": "https://[::1]:6443", "certificate-authority": "ca.crt"},
     {"client-certificate": "client.crt", "client-key": "client.key"}),
    ({"server": "https://kube.example:443", "insecure-skip-tls-verify": True}, {"token": "Bearer xyz"}),
    ({"server": "http://127.0.0.1:8080", "certificate-authority": "ca.crt"}, {}),
]


@pytest.mark.parametrize(("cluster", "user"), PLAIN)
@pytest.mark.parametrize("other", [False, True])
def test_a_plain_kubeconfig_reads_as_kubernetes_asyncio_reads_it(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], other: bool,
) -> None:
    path = _kubeconfig(tmp_path, cluster, user, other=other)
    context = "main" if other else None
    assert plain_kubeconfig(path, context) is not None, "read without kubernetes-asyncio"
    got = asyncio.run(load_credentials(path, context=context))
    assert got == asyncio.run(loaded_credentials(path, context=context))
    assert got.host == cluster["server"].rstrip("/")


@pytest.mark.parametrize(("cluster", "user"), [
    ({"server": "https://127.0.0.1:6443", "certificate-authority-data": "Y2E="}, {"token": "abc"}),
    ({"server": "https://127.0.0.1:6443"}, {"client-certificate-data": "Yw==", "client-key-data": "aw=="}),
    ({"server": "https://127.0.0.1:6443"}, {"exec": {"command": "get-token", "apiVersion": "client.authentication.k8s.io/v1"}}),
    ({"server": "https://127.0.0.1:6443", "tls-server-name": "kube"}, {"token": "abc"}),
    ({"server": "https://127.0.0.1:6443", "proxy-url": "http://proxy:3128"}, {"token": "abc"}),
])
def test_any_other_kubeconfig_is_left_to_kubernetes_asyncio(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any],
) -> None:
    assert plain_kubeconfig(_kubeconfig(tmp_path, cluster, user)) is None


def test_a_missing_context_or_file_is_left_to_kubernetes_asyncio_to_report(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"server": "https://127.0.0.1:6443"}, {"token": "abc"})
    assert plain_kubeconfig(path, "nope") is None
    assert plain_kubeconfig(str(tmp_path / "absent")) is None
    assert plain_kubeconfig(f"{path}:{path}") is None  # several files in KUBECONFIG


def test_the_service_account_reads_as_kubernetes_asyncio_reads_it(tmp_path: Path) -> None:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token")
    ca.write_text("a CA")
    for host in ("10.96.0.1", "fd00::1"):
        env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": "443"}
        plain = plain_in_cluster(env, token_file=str(token), ca_file=str(ca))
        assert plain is not None
        cfg = kclient.Configuration()
        InClusterConfigLoader(str(token), str(ca), environ=env).load_and_set(cfg)  # type: ignore[no-untyped-call]
        want = Credentials(host=str(cfg.host), ca_file=cfg.ssl_ca_cert, token=cfg.api_key["BearerToken"])
        assert _credentials(*plain) == want
    assert plain_in_cluster({}, token_file=str(token), ca_file=str(ca)) is None
    assert plain_in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
                            token_file=str(tmp_path / "none"), ca_file=str(ca)) is None
