"""A thin asynchronous REST client for the Kubernetes API.

Why not the generated kubernetes-asyncio API classes: building their models costs most of
the CPU of a large LIST (8.6 s for 20,000 pods against about 1 s paged and parsed with
orjson), and some generated calls fail on valid responses (``create_namespaced_binding``).
kubernetes-asyncio is still what reads a kubeconfig or the in-cluster service account; the
requests themselves are plain aiohttp with JSON bodies handled by orjson.

Objects travel as plain ``dict``; :mod:`batchsched.kube.parse` turns them into the core's
dataclasses. Every failure is raised as one of :mod:`batchsched.kube.errors`.

A caller may set :data:`before_send` for the requests of its task: a check run at the last
moment, when the request (headers and body, which aiohttp writes together) is written to
its connection, and raised from the request, which is then never sent. A replica's fence on
the writes it makes for the leader is such a check (:class:`batchsched.kube.leader.Fence`):
between a caller's own look and the write, a request waits for its connection (a TLS
handshake) and then, on Python before 3.12, for the task that writes it, behind whatever
else the event loop runs (a long scheduling step); the whole process may be paused
meanwhile. Only requests with a body are checked (every write the fence guards has one).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp.abc import AbstractStreamWriter

from batchsched import procmem
from batchsched.kube.api import JSON
from batchsched.kube.errors import KubeError, TemporaryError, from_status
from batchsched.kube.kubeconfig import plain_in_cluster, plain_kubeconfig

__all__ = ["JSON", "Credentials", "KubeClient", "before_send", "load_credentials", "plain_credentials"]

#: run just before each request of the current task is written (see the module docstring)
before_send: ContextVar[Callable[[], None] | None] = ContextVar("before_send", default=None)


class _Checked(aiohttp.BytesPayload):
    """A request body that runs a check right before it (and the headers buffered with it)
    is written; what the check raised is kept in ``refused``."""

    def __init__(self, value: bytes, *, check: Callable[[], None], content_type: str) -> None:
        super().__init__(value, content_type=content_type)
        self._check = check
        self.refused: Exception | None = None

    def _look(self) -> None:
        try:
            self._check()
        except Exception as exc:
            self.refused = exc
            raise

    async def write(self, writer: AbstractStreamWriter) -> None:
        self._look()
        await super().write(writer)

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        self._look()
        await super().write_with_length(writer, content_length)


@dataclass(slots=True, frozen=True)
class Credentials:
    """Where the API server is and how to prove who we are."""

    host: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    verify: bool = True

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.host.startswith("https"):
            return False
        if not self.verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


async def load_credentials(kubeconfig: str | None, *, context: str | None = None) -> Credentials:
    """Read a kubeconfig (or, with ``None``, the in-cluster service account): a plain one
    here (:mod:`batchsched.kube.kubeconfig`), any other through kubernetes-asyncio."""
    plain = plain_credentials(kubeconfig, context=context)
    return plain if plain is not None else await loaded_credentials(kubeconfig, context=context)


def plain_credentials(kubeconfig: str | None, *, context: str | None = None) -> Credentials | None:
    """The credentials of a plain kubeconfig or service account (:mod:`batchsched.kube.kubeconfig`);
    None for any other."""
    plain = plain_in_cluster() if kubeconfig is None else plain_kubeconfig(kubeconfig, context)
    return None if plain is None else _credentials(*plain)


async def loaded_credentials(kubeconfig: str | None, *, context: str | None = None) -> Credentials:
    """What kubernetes-asyncio reads of a kubeconfig (or of the service account)."""
    from kubernetes_asyncio import client as kclient
    from kubernetes_asyncio import config as kconfig

    cfg = kclient.Configuration()
    if kubeconfig is None:
        kconfig.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        await kconfig.load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=cfg
        )
    token = None
    for key in ("BearerToken", "authorization"):
        value = cfg.api_key.get(key)
        if value:
            prefix = cfg.api_key_prefix.get(key)
            token = f"{prefix} {value}" if prefix else value
            break
    return _credentials(str(cfg.host or ""), cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file, token,
                        bool(cfg.verify_ssl))


def _credentials(host: str, ca_file: str | None, cert_file: str | None, key_file: str | None,
                 token: str | None, verify: bool) -> Credentials:
    if token and not token.lower().startswith(("bearer ", "basic ")):
        token = f"Bearer {token}"
    return Credentials(host=host.rstrip("/"), ca_file=ca_file, cert_file=cert_file, key_file=key_file,
                       token=token, verify=verify)


_MANAGED = b',"managedFields":['
_AFTER_MANAGED = b']},"'
_NEXT_ITEM = b'"metadata":{'


#: the bytes that may follow a string's closing quote (in any JSON, spaced or not)
_AFTER_STRING = frozenset(b",}]: \t\r\n")


def _metadata_end(raw: bytes, start: int) -> int:
    """Where the first ``]},"`` after ``start`` whose quote opens a key is (-1: none)."""
    end = raw.find(_AFTER_MANAGED, start)
    while end >= 0:
        after = end + len(_AFTER_MANAGED)
        if after < len(raw) and raw[after] not in _AFTER_STRING:
            return end
        end = raw.find(_AFTER_MANAGED, end + 1)
    return -1


def without_managed_fields(raw: bytes) -> bytes:
    """``raw`` (a list or an object, as the apiserver writes JSON) without any object's
    ``metadata.managedFields``, cut from the bytes before they are parsed: nothing here
    reads them, and they are a third of a pod's JSON and most of its small objects (the
    parse of a page of pods: 40% shorter).

    The cut is safe on the bytes because the apiserver writes ``managedFields`` last in an
    object's metadata, an entry's ``fieldsV1`` holds objects only (so the array's closing
    bracket is its only ``]`` outside a string), and a quote inside a string is escaped: a
    ``"`` not followed by what may follow a string (``,}]:``, or space) opens one, so
    whatever comes before it is outside any string. So ``,"managedFields":[`` starts the
    field, and the first ``]},"`` after it whose quote opens a key ends the field and its
    metadata, where another key follows (``spec``, ``data``...). When no key follows within
    the same object (the next ``"metadata":{`` comes first), that object keeps its field."""
    find = raw.find
    start = find(_MANAGED)
    if start < 0:
        return raw
    parts: list[bytes] = []
    pos = 0
    while start >= 0:
        end = _metadata_end(raw, start)
        if end < 0:
            break
        nxt = find(_NEXT_ITEM, start, end)
        if nxt >= 0:  # no key after this metadata: keep it, go on from the next object
            start = find(_MANAGED, nxt)
            continue
        parts.append(raw[pos:start])
        pos = end + 1
        start = find(_MANAGED, pos)
    if not parts:
        return raw
    parts.append(raw[pos:])
    return b"".join(parts)


def _loads_bulk(data: bytes) -> Any:
    """Parse a large body (a page of a list) with the collector paused (it makes big
    parses 3-4x slower), and what it made kept out of the collector's walks: they hold no
    cycle, and are freed by their reference counts once read."""
    with procmem.collector_paused(kept=True):
        return orjson.loads(data)


def _parsed(raw: bytes) -> Any:
    """A JSON body parsed (a large one as :func:`_loads_bulk` does)."""
    return _loads_bulk(raw) if len(raw) > 1 << 20 else orjson.loads(raw)


def _page_of(raw: bytes) -> Any:
    """A page of a list parsed, without its objects' ``managedFields``."""
    return _parsed(without_managed_fields(raw))


class KubeClient:
    """Async requests to one API server. Create with :meth:`connect`, close with :meth:`close`."""

    def __init__(self, creds: Credentials, session: aiohttp.ClientSession) -> None:
        self.creds = creds
        self._session = session
        self._ssl = creds.ssl_context()

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None,
        *,
        context: str | None = None,
        max_connections: int = 256,
        user_agent: str = "batchsched",
    ) -> KubeClient:
        creds = await load_credentials(kubeconfig, context=context)
        return cls.from_credentials(
            creds, max_connections=max_connections, user_agent=user_agent
        )

    @classmethod
    def from_credentials(
        cls, creds: Credentials, *, max_connections: int = 256, user_agent: str = "batchsched"
    ) -> KubeClient:
        headers = {"Accept": "application/json", "User-Agent": user_agent}
        if creds.token:
            headers["Authorization"] = creds.token
        connector = aiohttp.TCPConnector(limit=max_connections, ssl=creds.ssl_context())
        session = aiohttp.ClientSession(
            base_url=None,
            connector=connector,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            json_serialize=lambda o: orjson.dumps(o).decode(),
        )
        return cls(creds, session)

    async def close(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- plain requests -------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 60.0,
        read: Callable[[bytes], Any] | None = None,
    ) -> Any:
        """One request; returns the parsed JSON body (or what ``read`` makes of the body's
        bytes), raises a :class:`KubeError` on failure."""
        raw = await self._exchange(method, path, params=params, body=body, content_type=content_type,
                                   timeout=timeout)
        if read is not None:
            return read(raw)
        if not raw:
            return None
        return _parsed(raw)

    async def text(self, path: str, *, timeout: float = 30.0) -> str:
        """A body that is not JSON (the apiserver's ``/metrics``)."""
        raw = await self._exchange("GET", path, timeout=timeout, accept="text/plain")
        return raw.decode(errors="replace")

    async def _exchange(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float,
        accept: str | None = None,
    ) -> bytes:
        """One request's answer, as sent; a :class:`KubeError` for an error status or a
        failed exchange."""
        raw_body = None if body is None else orjson.dumps(body)
        headers = {"Content-Type": content_type} if raw_body is not None else {}
        if accept is not None:
            headers["Accept"] = accept
        check = before_send.get()
        data: bytes | _Checked | None = raw_body
        if raw_body is not None and check is not None:
            data = _Checked(raw_body, check=check, content_type=content_type)
        try:
            async with self._session.request(
                method,
                self.creds.host + path,
                params=_params(params),
                data=data,
                headers=headers or None,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise _error_from(resp.status, raw)
        except KubeError:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            if isinstance(data, _Checked) and data.refused is not None:
                raise data.refused from None  # not sent: the check said no
            raise TemporaryError(0, type(exc).__name__, str(exc) or repr(exc)) from exc
        return raw

    async def get(self, path: str, **params: str | int) -> JSON:
        result: JSON = await self.request("GET", path, params=params)
        return result

    async def create(self, path: str, body: JSON) -> JSON:
        result: JSON = await self.request("POST", path, body=body)
        return result

    async def replace(self, path: str, body: JSON) -> JSON:
        result: JSON = await self.request("PUT", path, body=body)
        return result

    async def patch(self, path: str, body: Any, *, kind: str = "merge") -> JSON:
        ctype = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "json": "application/json-patch+json",
            "apply": "application/apply-patch+yaml",
        }[kind]
        result: JSON = await self.request("PATCH", path, body=body, content_type=ctype)
        return result

    async def delete(self, path: str, body: JSON | None = None, **params: str | int) -> Any:
        return await self.request("DELETE", path, body=body, params=params)

    async def pages(self, path: str, *, page: int = 500, **params: str | int) -> AsyncGenerator[tuple[list[JSON], str], None]:
        """Each page of a consistent list of a collection, with the list's resourceVersion.
        The next page is asked for before this one is handed over, so the server prepares
        it while the caller reads this one."""

        def ask(cont: str) -> asyncio.Future[Any]:
            query: dict[str, str | int] = dict(params)
            query["limit"] = page
            if cont:
                query["continue"] = cont
            return asyncio.ensure_future(self.request("GET", path, params=query, timeout=300, read=_page_of))

        pending: asyncio.Future[Any] | None = ask("")
        try:
            while pending is not None:
                result = await pending
                meta = result.get("metadata") or {}
                cont = meta.get("continue") or ""
                pending = ask(cont) if cont else None
                await asyncio.sleep(0)  # the next request under way before this page is read
                yield result.get("items") or [], str(meta.get("resourceVersion", ""))
        finally:
            if pending is not None:
                pending.cancel()

    async def list(self, path: str, *, page: int = 500, **params: str | int) -> tuple[list[JSON], str]:
        """Every item of a collection, paged; returns ``(items, resourceVersion)``."""
        items: list[JSON] = []
        rv = ""
        async with contextlib.aclosing(self.pages(path, page=page, **params)) as pages:
            async for got, version in pages:
                items.extend(got)
                rv = version
        return items, rv

    async def watch(
        self,
        path: str,
        resource_version: str,
        *,
        timeout_seconds: int = 300,
        **params: str | int,
    ) -> AsyncIterator[tuple[str, JSON]]:
        """Yield ``(type, object)`` from a watch until the server closes it.

        Raises :class:`ExpiredError` when the resourceVersion is too old (the caller relists)
        and :class:`TemporaryError` on a dropped connection.
        """
        query: dict[str, str | int] = dict(params)
        query.update(
            watch=1,
            resourceVersion=resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=timeout_seconds,
        )
        try:
            async with self._session.get(
                self.creds.host + path,
                params=_params(query),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_read=timeout_seconds + 30, sock_connect=10
                ),
            ) as resp:
                if resp.status >= 400:
                    raise _error_from(resp.status, await resp.read())
                buf = b""
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    while True:
                        nl = buf.find(b"\n")
                        if nl < 0:
                            break
                        line, buf = buf[:nl], buf[nl + 1 :]
                        if not line.strip():
                            continue
                        event = orjson.loads(without_managed_fields(line))
                        etype = event.get("type", "")
                        obj = event.get("object") or {}
                        if etype == "ERROR":
                            raise from_status(int(obj.get("code") or 500), obj)
                        yield etype, obj
        except KubeError:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise TemporaryError(0, type(exc).__name__, str(exc) or repr(exc)) from exc


def _params(params: Mapping[str, str | int] | None) -> dict[str, str] | None:
    if not params:
        return None
    return {k: str(v) for k, v in params.items()}


def _error_from(status: int, raw: bytes) -> KubeError:
    text = raw.decode(errors="replace")[:500]
    try:
        st = orjson.loads(raw)
    except orjson.JSONDecodeError:
        st = None
    return from_status(status, st if isinstance(st, dict) else None, fallback=text)
