"""Where the API server is and who we are, read without kubernetes-asyncio when that is plain.

kubernetes-asyncio's loaders import its whole generated client (every API model) before
they read a line: 0.3-0.6 s of a start, on the path to the first list. The kubeconfigs and
service accounts a scheduler runs with are mostly plain, and those are read here:

- in the cluster: ``KUBERNETES_SERVICE_HOST`` and ``_PORT``, the service account's token
  and CA files;
- a kubeconfig of one file whose context names a cluster with a ``server``, a CA file (or
  ``insecure-skip-tls-verify``), and a user with a ``token``, a ``tokenFile`` or client
  certificate and key files (relative paths are from the kubeconfig's folder).

Anything else (data fields, exec and auth-provider plugins, basic auth, proxies, a TLS
server name, several files in ``KUBECONFIG``) returns None and kubernetes-asyncio reads it,
as before. Both ways give the same :class:`~batchsched.kube.client.Credentials`
(``tests/unit/test_kubeconfig.py`` holds them equal).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

__all__ = ["SERVICE_CA", "SERVICE_TOKEN", "Plain", "plain_in_cluster", "plain_kubeconfig"]

#: the service account's files in a pod
SERVICE_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

#: (host, CA file, certificate file, key file, the Authorization header's token, verify)
Plain = tuple[str, str | None, str | None, str | None, str | None, bool]

_CLUSTER_KEYS = {"server", "certificate-authority", "insecure-skip-tls-verify", "extensions"}
_USER_KEYS = {"token", "tokenFile", "client-certificate", "client-key", "extensions"}


def _join(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"


def plain_in_cluster(
    environ: dict[str, str] | os._Environ[str] = os.environ, *, token_file: str = SERVICE_TOKEN,
    ca_file: str = SERVICE_CA,
) -> Plain | None:
    """The service account's credentials; None when something is missing (kubernetes-asyncio
    then says what)."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port or not os.path.isfile(token_file) or not os.path.isfile(ca_file):
        return None
    token = Path(token_file).read_text()
    if not token or not Path(ca_file).read_text():
        return None
    return f"https://{_join(host, port)}", ca_file, None, None, f"Bearer {token}", True


def _named(items: Any, name: str, key: str) -> dict[str, Any] | None:
    for item in items or ():
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(key), dict):
            return dict(item[key])
    return None


def plain_kubeconfig(path: str, context: str | None = None) -> Plain | None:
    """The credentials of ``path`` (its current context, or ``context``); None when it is
    not one of the plain kinds the module names."""
    if os.pathsep in path:
        return None
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(doc, dict):
        return None
    ctx = _named(doc.get("contexts"), context or str(doc.get("current-context") or ""), "context")
    if ctx is None:
        return None
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster") or ""), "cluster")
    user = _named(doc.get("users"), str(ctx.get("user") or ""), "user") if ctx.get("user") else {}
    if cluster is None or user is None or set(cluster) - _CLUSTER_KEYS or set(user) - _USER_KEYS:
        return None
    host = cluster.get("server")
    if not isinstance(host, str) or not host:
        return None
    base = os.path.abspath(os.path.dirname(path))

    def file(value: Any) -> str | None:
        return None if value is None else os.path.join(base, str(value))

    token: str | None = None
    if "tokenFile" in user:
        try:
            token = Path(file(user["tokenFile"]) or "").read_text()
        except OSError:
            return None
    elif "token" in user:
        token = str(user["token"])
    host = host.rstrip("/")
    ca = cert = key = None
    if host.startswith("https"):  # files of TLS only (an http server is asked in the clear)
        ca = file(cluster.get("certificate-authority"))
        cert, key = file(user.get("client-certificate")), file(user.get("client-key"))
    verify = not bool(cluster.get("insecure-skip-tls-verify"))
    return host, ca, cert, key, f"Bearer {token}" if token else None, verify
