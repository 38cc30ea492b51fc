"""A server that refuses what a fetch asked for hangs up while the client may still be writing: the
client's next write must not fail with paramiko's ``Socket is closed`` (an OSError, which the fetch
took for a transport failure and so skipped its fallback to the branches' history: the flaky
``test_ssh_commit_no_ref_points_at_falls_back_to_history`` under load); the client reads the end of
the stream instead, as git does."""

from __future__ import annotations

import time
from typing import Any

from dulwich.protocol import Protocol

from pko.git.ssh import ParamikoSSHVendor, load_private_key, parse_known_hosts

UNKNOWN = b"1" * 40  # an object the repository does not have: the server refuses the want


def test_a_write_after_the_server_refused_and_hung_up_does_not_raise(git_ssh: Any) -> None:
    vendor = ParamikoSSHVendor(
        parse_known_hosts([git_ssh.known_hosts]), load_private_key(git_ssh.client_key_pem)
    )
    conn = vendor.run_command(git_ssh.host, "git-upload-pack '/repo.git'", username="git", port=git_ssh.port)
    try:
        proto = Protocol(conn.read, conn.write)
        advertised = list(proto.read_pkt_seq())
        assert advertised, "the server advertised no refs"
        proto.write_pkt_line(b"want " + UNKNOWN + b"\n")
        proto.write_pkt_line(None)
        channel = conn._channel
        deadline = time.monotonic() + 10
        while not (channel.closed or channel.exit_status_ready()):
            assert time.monotonic() < deadline, "the server did not hang up on an unknown want"
            time.sleep(0.05)
        time.sleep(0.2)  # its close processed: a write now met "Socket is closed" before the fix
        conn.write(b"0009done\n")
        assert conn.read() == b""
        assert channel.recv_exit_status() != 0
    finally:
        conn.close()
