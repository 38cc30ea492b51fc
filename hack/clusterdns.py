#!/usr/bin/env python3
"""Cluster DNS for a local node: Services and EndpointSlices from the API, as a hosts file dnsmasq reads.

No CoreDNS package exists here, so ``hack/localnode.py`` runs dnsmasq (``--hostsdir``, which re-reads
changed files by itself, ``--no-resolv``: it never forwards a query) and this watcher, which writes:

* ``<svc>.<ns>.svc.cluster.local``: the ClusterIP, or for a headless Service its ready endpoints
  (also the not-ready ones when ``publishNotReadyAddresses`` is set), as CoreDNS answers;
* ``<hostname>.<svc>.<ns>.svc.cluster.local``: an endpoint that has a hostname (StatefulSet pods).

Endpoints come from ``discovery.k8s.io/v1`` EndpointSlices (labelled ``kubernetes.io/service-name``), as
CoreDNS reads them: the v1 Endpoints API is deprecated since Kubernetes 1.33. An endpoint whose
``ready`` condition is unset counts as ready (the API's rule).

It lists Services and EndpointSlices every second and rewrites the file (atomically) only when the
records change. Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

DOMAIN = "cluster.local"


def _client(kubeconfig: Path) -> tuple[str, str, ssl.SSLContext]:
    cfg = json.loads(kubeconfig.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    ctx = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    return cluster["server"], cfg["users"][0]["user"]["token"], ctx


def _get(server: str, token: str, ctx: ssl.SSLContext, path: str) -> dict[str, Any]:
    req = urllib.request.Request(server + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
        data: dict[str, Any] = json.load(r)
        return data


SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def records(services: list[dict[str, Any]], slices: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(ip, name) pairs for the hosts file, sorted."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for eps in slices:
        meta = eps.get("metadata") or {}
        service = (meta.get("labels") or {}).get(SERVICE_NAME_LABEL)
        if service and eps.get("addressType") in ("IPv4", "IPv6"):
            by_key.setdefault((meta.get("namespace", ""), service), []).append(eps)
    out: set[tuple[str, str]] = set()
    for svc in services:
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        fqdn = f"{name}.{ns}.svc.{DOMAIN}"
        spec = svc.get("spec") or {}
        cluster_ip = spec.get("clusterIP")
        if cluster_ip and cluster_ip != "None":
            out.add((cluster_ip, fqdn))
            continue
        publish_all = bool(spec.get("publishNotReadyAddresses"))
        for eps in by_key.get((ns, name), []):
            for endpoint in eps.get("endpoints") or []:
                if not publish_all and (endpoint.get("conditions") or {}).get("ready") is False:
                    continue
                for ip in endpoint.get("addresses") or []:
                    out.add((ip, fqdn))
                    if endpoint.get("hostname"):
                        out.add((ip, f"{endpoint['hostname']}.{fqdn}"))
    return sorted(out)


def write_if_changed(path: Path, lines: list[tuple[str, str]]) -> bool:
    text = "".join(f"{ip} {name}\n" for ip, name in lines)
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".hosts.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--hosts-dir", type=Path, required=True)
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args(argv)
    server, token, ctx = _client(args.kubeconfig)
    target = args.hosts_dir / "cluster.hosts"
    while True:
        try:
            services = _get(server, token, ctx, "/api/v1/services")["items"]
            slices = _get(server, token, ctx, "/apis/discovery.k8s.io/v1/endpointslices")["items"]
            if write_if_changed(target, records(services, slices)):
                print(f"clusterdns: {len(services)} services written", flush=True)
        except Exception as exc:
            print(f"clusterdns: {exc}", file=sys.stderr, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
