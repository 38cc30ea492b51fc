"""The restartable agent the client tests talk to (imported by conftest.py and the tests)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pko.agent.pulumirunner import RunnerSettings
from pko.agent.server import ServeOptions, serve

from pko.devtools.agents import AuthWorld
from pko.devtools.standin import FakePulumi

OPERATOR_SA = "operator"

PROGRAM = """\
name: clientflow
runtime: yaml
config:
  seconds:
    type: string
    default: "0"
resources:
  first:
    type: test:Echo
    properties:
      message: hello
  slow:
    type: test:Hang
    properties:
      seconds: ${seconds}
      after: ${first.message}
outputs:
  message: ${first.message}
"""


class Proxy:
    """A TCP proxy in front of the agent: a stable address, and connections the test can cut.

    grpclib's ``Server.close`` leaves established connections open and still serving, so an
    in-process agent that stops is not gone for a connected client; a real agent process exits and
    its connections drop. Cutting the proxy's connections plays that part.
    """

    def __init__(self) -> None:
        self.target_port = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:  # the agent is down: refuse, as its closed port would
            writer.transport.abort()
            return
        self.writers += [writer, up_writer]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()

    async def stop(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@dataclass
class Agent:
    """A real agent on a fixed loopback port behind ``proxy``, whose address clients use.

    ``restart`` keeps the port, workspace, journal and Pulumi state, as a container restart does;
    stopping drops every client connection, as the end of the agent's process does.
    """

    work_dir: Path
    journal_dir: Path
    fake: FakePulumi
    world: AuthWorld
    port: int
    pulumi_home: Path
    proxy: Proxy = field(default_factory=lambda: Proxy())
    proxy_port: int = 0
    options: ServeOptions | None = None
    task: asyncio.Task[int] | None = None
    starts: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.proxy_port}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        bound: asyncio.Future[tuple[str, int]] = loop.create_future()
        env = {
            "PULUMI_HOME": str(self.pulumi_home),
            "PULUMI_BACKEND_URL": self.fake.backend_url,
            "PULUMI_CONFIG_PASSPHRASE": self.fake.passphrase,
        }
        self.options = ServeOptions(
            runner=RunnerSettings(work_dir=self.work_dir, env_vars=env, pulumi_root=self.fake.root),
            host="127.0.0.1",
            port=self.port,
            journal_dir=self.journal_dir,
            shutdown_grace=30.0,
            authorizer=self.world.authorizer(),
            bound=bound,
        )
        self.task = asyncio.create_task(serve(self.options, install_signal_handlers=False))
        waits: set[asyncio.Future[Any]] = {bound, self.task}
        done, _ = await asyncio.wait(waits, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if self.task in done:
            self.task.result()
            raise AssertionError("agent exited during startup")
        assert bound in done, "agent did not start listening"
        self.starts += 1
        self.proxy.target_port = self.port
        if not self.proxy_port:
            self.proxy_port = await self.proxy.start()

    async def stop(self) -> None:
        if self.options is not None and self.task is not None and not self.task.done():
            self.options.stop.set()
            await asyncio.wait_for(self.task, 120)
        self.task = None
        self.proxy.cut()

    async def close(self) -> None:
        await self.stop()
        await self.proxy.stop()

    async def restart(self, *, new_pulumi_home: bool = False) -> None:
        await self.stop()
        if new_pulumi_home:  # forget the workspace's current stack, as a fresh container would
            self.pulumi_home = self.pulumi_home.with_name(f"{self.pulumi_home.name}-{self.starts}")
            self.pulumi_home.mkdir(parents=True, exist_ok=True)
        await self.start()
