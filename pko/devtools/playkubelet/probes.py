"""Readiness probes (tcpSocket, grpc, httpGet, exec), run against a container's pod IP."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from .podstate import PodState
from .programs import expand_vars, rewrite_paths
from .runtime import Container, Obj


class PodProbes(PodState):
    """A container's readiness: probed every period; Ready after successThreshold successes, unready
    after failureThreshold failures."""

    async def _probe_loop(
        self, c: Container, probe: Obj, env: Mapping[str, str], cwd: Path, mounts: list[tuple[str, Path]]
    ) -> None:
        await asyncio.sleep(min(float(probe.get("initialDelaySeconds", 0)), 1.0))
        period = min(float(probe.get("periodSeconds", 10)), 0.5)
        successes = failures = 0
        while True:
            ok = await self._probe(c, probe, env, cwd, mounts)
            if ok:
                successes, failures = successes + 1, 0
                if not c.ready and successes >= int(probe.get("successThreshold", 1)):
                    c.ready = True
                    await self._push()
            else:
                successes, failures = 0, failures + 1
                if c.ready and failures >= int(probe.get("failureThreshold", 3)):
                    c.ready = False
                    await self._push()
            await asyncio.sleep(period)

    def _port(self, c: Container, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"no port named {port}")

    async def _probe(
        self, c: Container, probe: Obj, env: Mapping[str, str], cwd: Path, mounts: list[tuple[str, Path]]
    ) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        ip = self.ip or "127.0.0.1"
        try:
            if "tcpSocket" in probe:
                port = self._port(c, probe["tcpSocket"]["port"])
                _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
                writer.close()
                return True
            if "grpc" in probe:
                from grpclib.client import Channel
                from grpclib.health.v1.health_grpc import HealthStub
                from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

                channel = Channel(ip, self._port(c, probe["grpc"]["port"]))
                try:
                    req = HealthCheckRequest(service=probe["grpc"].get("service", ""))
                    resp = await asyncio.wait_for(HealthStub(channel).Check(req), timeout)
                    return bool(resp.status == HealthCheckResponse.SERVING)
                finally:
                    channel.close()
            if "httpGet" in probe:
                import aiohttp

                get = probe["httpGet"]
                port = self._port(c, get["port"])
                url = f"{get.get('scheme', 'HTTP').lower()}://{ip}:{port}{get.get('path', '/')}"
                async with (
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                    session.get(url, ssl=False) as answer,
                ):
                    return 200 <= answer.status < 400
            if "exec" in probe:
                argv = [
                    expand_vars(rewrite_paths(a, mounts), env) for a in probe["exec"].get("command") or []
                ]
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd,
                    env=dict(env),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                try:
                    return await asyncio.wait_for(proc.wait(), timeout) == 0
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
                    return False
        except Exception:  # any failure is a failed probe
            return False
        return True
