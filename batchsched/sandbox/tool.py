"""What every tool run out of cluster against a sandbox shares: its process.

The training operator, Kueue and the KubeRay operator are each built from a pinned Go
module and run as a process of the machine against one sandbox, standing in for the pod
a cluster would run them in. :class:`ToolProcess` is that process: started with the
sandbox's admin kubeconfig, its output in the sandbox's ``logs/``, checked alive while
the caller waits for it, and stopped (SIGTERM, then SIGKILL after a grace period) exactly
as it was started; a context manager. Each tool's module says what its pod would have and
when it is ready.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from batchsched.kube.client import KubeClient
from batchsched.kube.errors import ConflictError
from batchsched.sandbox import build
from batchsched.sandbox.cluster import SandboxError, SandboxState, http_ok, log_tail


class ToolProcess:
    """One tool's process against one running sandbox. Subclasses set :attr:`what` (its
    name in messages) and :attr:`log_name`, and implement :meth:`start`."""

    what = "the tool"
    log_name = "tool.log"

    def __init__(self, sandbox: SandboxState, *, binary: Path | None = None) -> None:
        self.sandbox = sandbox
        self.binary = binary
        self.log = Path(sandbox.dir) / "logs" / self.log_name
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self, *, grace: float = 10.0) -> None:
        """Undo what the tool's pod would leave behind (:meth:`_before_stop`), then SIGTERM
        the process this object started, SIGKILL it after ``grace`` seconds; the process is
        stopped even if the first step fails."""
        try:
            self._before_stop()
        finally:
            proc, self.process = self.process, None
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def _before_stop(self) -> None:
        """What to undo before the process stops (nothing, unless a tool says)."""

    def _binary(self, build_it: Callable[[], Path]) -> Path:
        """The binary given, else the one ``build_it()`` builds (or finds cached); a
        :class:`SandboxError` if it is already running or cannot be built."""
        if self.process is not None:
            raise SandboxError(f"{self.what} is already running")
        if self.binary is not None:
            return self.binary
        try:
            return build_it()
        except build.BuildError as exc:
            raise SandboxError(str(exc)) from exc

    def _spawn(self, binary: Path, args: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``binary`` with ``args``, the sandbox's admin kubeconfig and ``env``; its
        output to :attr:`log`."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, "KUBECONFIG": self.sandbox.kubeconfig, **(env or {})}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [str(binary), *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.sandbox.dir, env=full_env,
            )

    def _wait_http(self, url: str, deadline: float) -> None:
        """Until ``url`` answers 200; a :class:`SandboxError` when the monotonic
        ``deadline`` passes or the process exits."""
        if not http_ok(url, deadline=deadline, alive=self._check_alive, interval=0.2):
            raise SandboxError(f"{self.what} was not ready in time: {log_tail(str(self.log))}")

    async def _mount_secret(self, namespace: str, name: str, files: tuple[str, ...], folder: Path,
                            deadline: float) -> None:
        """Play the kubelet for a Secret the tool fills itself (its certificate rotator):
        wait until ``files`` are all in it, then write them into ``folder``, each whole."""
        async with await KubeClient.connect(self.sandbox.kubeconfig) as client:
            while True:
                self._check_alive()
                secret = await client.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
                data: dict[str, str] = secret.get("data") or {}
                if all(data.get(f) for f in files):
                    break
                if time.monotonic() > deadline:
                    raise SandboxError(f"{self.what} wrote no certificates into its Secret {namespace}/{name}: "
                                       f"{log_tail(str(self.log))}")
                await asyncio.sleep(0.2)
        folder.mkdir(parents=True, exist_ok=True)
        for f in files:
            write_whole(folder / f, base64.b64decode(data[f]))

    def _check_alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            raise SandboxError(f"{self.what} exited: {log_tail(str(self.log))}")


async def create_once(client: KubeClient, collection: str, body: dict[str, Any]) -> None:
    """Create ``body`` unless an object of its name is there already."""
    with contextlib.suppress(ConflictError):
        await client.create(collection, body)


def write_whole(path: Path, content: bytes) -> None:
    """Write ``path`` so that a reader sees the old file or the new one, never a part (two
    sandboxes on one machine may write the same file)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
