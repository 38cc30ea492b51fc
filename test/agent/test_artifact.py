"""Tarball artifacts: digest verification, download retries, and extraction of hostile archives."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pko.agent.artifact import Digest, extract_tarball, fetch_artifact, override_host
from pko.agent.errors import DigestMismatch, SourceError, UnreachableError, UnsafeArchive, UsageError

Member = Callable[[tarfile.TarFile], None]


def regular(name: str, data: bytes = b"data\n", mode: int = 0o644) -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = mode
        tar.addfile(info, io.BytesIO(data))

    return add


def special(name: str, kind: bytes, linkname: str = "") -> Member:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = linkname
        info.mode = 0o755
        tar.addfile(info)

    return add


def tarball(*members: Member, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=fmt) as tar,
    ):
        for add in members:
            add(tar)
    return buf.getvalue()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def extract(data: bytes, dest: Path, max_size: int | None = 1 << 20, max_members: int = 1000) -> Any:
    dest.mkdir(exist_ok=True)
    return extract_tarball(io.BytesIO(data), dest, max_size=max_size, max_members=max_members)


def listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# --- digests (pure) -----------------------------------------------------------------------------


def test_digest_forms() -> None:
    hexdigest = "ab" * 32
    assert str(Digest.parse(f"sha256:{hexdigest}")) == f"sha256:{hexdigest}"
    assert Digest.parse(hexdigest.upper()) == Digest("sha256", hexdigest)
    assert Digest.parse("sha512:" + "0" * 128).algorithm == "sha512"


@pytest.mark.parametrize("bad", ["md5:" + "0" * 32, "sha256:abc", "sha256:" + "g" * 64, ""])
def test_malformed_digest_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError):
        Digest.parse(bad)


def test_override_host_keeps_path_and_query() -> None:
    url = "http://source-controller.flux-system.svc.cluster.local./gitrepository/ns/repo/abc.tar.gz?x=1"
    assert (
        override_host(url, "localhost:8080") == "http://localhost:8080/gitrepository/ns/repo/abc.tar.gz?x=1"
    )
    assert override_host(url, None) == url


# --- fetch: download + verify + extract ---------------------------------------------------------


def test_good_digest_extracts_with_normalized_modes(artifact_http: Any, tmp_path: Path) -> None:
    data = tarball(
        special("proj", tarfile.DIRTYPE),
        regular("proj/Pulumi.yaml", b"name: p\nruntime: yaml\n"),
        regular("proj/run.sh", b"#!/bin/sh\n", mode=0o4755),  # setuid must not survive
        special("proj/link", tarfile.SYMTYPE, "Pulumi.yaml"),
    )
    url = artifact_http.serve("/good.tar.gz", data)
    dest = tmp_path / "out"
    dest.mkdir()
    stats = fetch_artifact(url, sha256(data), dest)
    assert (stats.files, stats.symlinks) == (2, 1)
    assert (dest / "proj" / "Pulumi.yaml").read_text() == "name: p\nruntime: yaml\n"
    assert stat.S_IMODE((dest / "proj" / "run.sh").stat().st_mode) == 0o755
    assert os.readlink(dest / "proj" / "link") == "Pulumi.yaml"
    assert list(tmp_path.iterdir()) == [dest]  # the download spool is gone


def test_bad_digest_extracts_nothing(artifact_http: Any, tmp_path: Path) -> None:
    data = tarball(regular("Pulumi.yaml"))
    url = artifact_http.serve("/tampered.tar.gz", data)
    dest = tmp_path / "out"
    dest.mkdir()
    wrong = "sha256:" + "0" * 64
    with pytest.raises(DigestMismatch) as info:
        fetch_artifact(url, wrong, dest)
    assert str(info.value).startswith(f"digest mismatch for {url}: expected {wrong}, got {sha256(data)}")
    assert list(dest.iterdir()) == []


def test_server_errors_are_retried(artifact_http: Any, tmp_path: Path) -> None:
    data = tarball(regular("Pulumi.yaml"))
    url = artifact_http.serve("/flaky.tar.gz", data, failures=[503, 502])
    dest = tmp_path / "out"
    dest.mkdir()
    fetch_artifact(url, sha256(data), dest, retries=3, backoff=0.01)
    assert artifact_http.hits["/flaky.tar.gz"] == 3
    assert (dest / "Pulumi.yaml").exists()


def test_not_found_is_not_retried(artifact_http: Any, tmp_path: Path) -> None:
    url = f"{artifact_http.base}/missing.tar.gz"
    with pytest.raises(SourceError, match=r"artifact not found at .*/missing.tar.gz \(HTTP 404\)"):
        fetch_artifact(url, "sha256:" + "0" * 64, tmp_path, retries=3, backoff=0.01)


def test_unreachable_artifact_host(closed_port: int, tmp_path: Path) -> None:
    with pytest.raises(UnreachableError, match=r"cannot reach .*connection refused"):
        fetch_artifact(
            f"http://127.0.0.1:{closed_port}/a.tar.gz", "sha256:" + "0" * 64, tmp_path, backoff=0.01
        )


def test_download_larger_than_the_limit_is_refused(artifact_http: Any, tmp_path: Path) -> None:
    data = os.urandom(4096)
    url = artifact_http.serve("/big.bin", data)
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(UnsafeArchive, match="over the limit of 1000 bytes"):
        fetch_artifact(url, sha256(data), dest, max_size=1000)


def test_not_a_tarball_is_a_source_error(artifact_http: Any, tmp_path: Path) -> None:
    data = gzip.compress(b"<html>not a tarball</html>" * 40)
    url = artifact_http.serve("/html.gz", data)
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(SourceError, match="not a valid tar archive"):
        fetch_artifact(url, sha256(data), dest)


# --- hostile archives ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("members", "reason"),
    [
        ([regular("../evil")], "climbs out"),
        ([regular("a/../../evil")], "climbs out"),
        ([regular("/etc/evil")], "absolute path"),
        ([special("l", tarfile.SYMTYPE, "/etc")], "relative path inside"),
        ([special("l", tarfile.SYMTYPE, "../outside")], "points outside"),
        ([special("d", tarfile.DIRTYPE), special("d/l", tarfile.SYMTYPE, "../../x")], "points outside"),
        # each link lexically inside, but b -> . makes b/.. the parent of the target directory
        ([special("b", tarfile.SYMTYPE, "."), special("l", tarfile.SYMTYPE, "b/..")], "resolves outside"),
        ([special("link", tarfile.SYMTYPE, "sub"), regular("link/x")], "through symlink"),
        ([special("h", tarfile.LNKTYPE, "../outside")], "climbs out"),
        (
            [special("l", tarfile.SYMTYPE, "x"), special("h", tarfile.LNKTYPE, "l")],
            "must name a regular file",
        ),
        ([regular("f"), special("f", tarfile.SYMTYPE, "g")], "collides"),
    ],
)
def test_escaping_archives_are_rejected(members: list[Member], reason: str, tmp_path: Path) -> None:
    dest = tmp_path / "root" / "dest"
    dest.parent.mkdir()
    with pytest.raises(UnsafeArchive, match=reason):
        extract(tarball(*members), dest)
    assert listing(tmp_path / "root") <= {"dest"} | {f"dest/{p}" for p in listing(dest)}


def test_gnu_long_names_are_checked_too(tmp_path: Path) -> None:
    name = "a/" * 60 + "../" * 70 + "evil"
    with pytest.raises(UnsafeArchive, match="climbs out"):
        extract(tarball(regular(name), fmt=tarfile.GNU_FORMAT), tmp_path / "dest")


def test_total_size_is_bounded(tmp_path: Path) -> None:
    members = [regular(f"f{i}", b"x" * 400) for i in range(3)]
    with pytest.raises(UnsafeArchive, match="beyond the limit of 1000 bytes"):
        extract(tarball(*members), tmp_path / "dest", max_size=1000)
    extract(tarball(*members), tmp_path / "ok", max_size=1200)


def test_member_count_is_bounded(tmp_path: Path) -> None:
    members = [regular(f"f{i}", b"") for i in range(11)]
    with pytest.raises(UnsafeArchive, match="more than 10 members"):
        extract(tarball(*members), tmp_path / "dest", max_members=10)


def test_oversized_headers_stop_a_decompression_bomb(tmp_path: Path) -> None:
    def huge_pax(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo("small")
        info.pax_headers = {"comment": "z" * (3 << 20)}  # compresses to almost nothing
        tar.addfile(info, io.BytesIO(b""))

    data = tarball(huge_pax)
    assert len(data) < 64 * 1024
    with pytest.raises(UnsafeArchive, match=r"expands beyond|extended header"):
        extract(data, tmp_path / "dest", max_size=1000, max_members=10)


def test_no_limit_means_no_limit(tmp_path: Path) -> None:
    extract(tarball(regular("big", b"y" * 5000)), tmp_path / "dest", max_size=None)
    assert (tmp_path / "dest" / "big").stat().st_size == 5000


def test_hard_links_become_copies_and_duplicates_take_the_last(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    extract(
        tarball(
            regular("a", b"first"),
            regular("a", b"second"),
            special("b", tarfile.LNKTYPE, "a"),
            special("fifo", tarfile.FIFOTYPE),
        ),
        dest,
    )
    assert (dest / "a").read_bytes() == b"second"
    assert (dest / "b").read_bytes() == b"second"
    assert (dest / "a").stat().st_ino != (dest / "b").stat().st_ino
    assert not (dest / "fifo").exists()


def test_symlink_chains_inside_the_tree_are_kept(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    extract(
        tarball(
            regular("real/file", b"ok"),
            special("one", tarfile.SYMTYPE, "real"),
            special("two", tarfile.SYMTYPE, "one/file"),
            special("dangling", tarfile.SYMTYPE, "not-yet"),
        ),
        dest,
    )
    assert (dest / "two").read_bytes() == b"ok"
    assert os.readlink(dest / "dangling") == "not-yet"


# --- redirects (issue 11) --------------------------------------------------------------------------


def _redirecting_server(location: str) -> Any:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_redirect_to_ftp_is_refused_and_never_followed(tmp_path: Path) -> None:
    import socket
    import threading

    # A stand-in FTP server that records whether anyone connected (urllib would log in and echo it).
    ftp = socket.socket()
    ftp.bind(("127.0.0.1", 0))
    ftp.listen(1)
    ftp.settimeout(5)
    contacted: list[bool] = []

    def accept() -> None:
        try:
            conn, _ = ftp.accept()
            contacted.append(True)
            conn.sendall(b"220 hostile ftp says hello\r\n")
            conn.close()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    server = _redirecting_server(f"ftp://127.0.0.1:{ftp.getsockname()[1]}/a.tar.gz")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/a.tar.gz"
        with pytest.raises(SourceError, match="only http and https redirects are followed") as info:
            fetch_artifact(url, "sha256:" + "0" * 64, tmp_path, retries=1, backoff=0.01, timeout=5)
        assert "hostile" not in str(info.value)
    finally:
        server.shutdown()
        ftp.close()
    assert contacted == [], "the agent connected to the ftp:// redirect target"


def test_a_cross_origin_http_redirect_is_followed_and_the_digest_still_decides(
    artifact_http: Any, tmp_path: Path
) -> None:
    data = tarball(regular("Pulumi.yaml"))
    target = artifact_http.serve("/moved.tar.gz", data)
    server = _redirecting_server(target)
    try:
        dest = tmp_path / "out"
        dest.mkdir()
        fetch_artifact(
            f"http://127.0.0.1:{server.server_address[1]}/a.tar.gz", sha256(data), dest, backoff=0.01
        )
        assert (dest / "Pulumi.yaml").exists()
        with pytest.raises(DigestMismatch):
            fetch_artifact(
                f"http://127.0.0.1:{server.server_address[1]}/a.tar.gz", "sha256:" + "1" * 64, tmp_path / "x"
            )
    finally:
        server.shutdown()


def test_a_huge_pax_header_is_refused_before_it_is_read_whatever_the_size_limit(tmp_path: Path) -> None:
    def huge_pax(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo("small")
        info.pax_headers = {"comment": "z" * (8 << 20)}  # 8 MiB of header, a few KiB compressed
        tar.addfile(info, io.BytesIO(b""))

    data = tarball(huge_pax)
    assert len(data) < 64 * 1024
    with pytest.raises(UnsafeArchive, match="extended header"):
        extract(data, tmp_path / "dest", max_size=None, max_members=10)


def test_deep_trees_cost_linear_filesystem_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted in filesystem calls, not seconds: doubling the depth must not quadruple the work."""

    def chain(depth: int) -> bytes:
        def members(tar: tarfile.TarFile) -> None:
            path = ""
            for _ in range(depth):
                path = f"{path}d/" if path else "d/"
                info = tarfile.TarInfo(path.rstrip("/"))
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            leaf = tarfile.TarInfo(path + "f")
            leaf.size = 1
            tar.addfile(leaf, io.BytesIO(b"x"))

        return tarball(members)

    calls = [0]
    real_lstat, real_stat = os.lstat, os.stat

    def counting_lstat(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real_lstat(*args, **kwargs)

    def counting_stat(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real_stat(*args, **kwargs)

    def work(depth: int) -> int:
        data = chain(depth)
        monkeypatch.setattr(os, "lstat", counting_lstat)
        monkeypatch.setattr(os, "stat", counting_stat)
        calls[0] = 0
        try:
            extract(data, tmp_path / f"d{depth}", max_size=None, max_members=10 * depth)
        finally:
            monkeypatch.setattr(os, "lstat", real_lstat)
            monkeypatch.setattr(os, "stat", real_stat)
        return calls[0]

    small, large = work(100), work(200)
    assert large <= 2.5 * small, (small, large)
