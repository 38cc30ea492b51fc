"""pko.git's credentials and URL parsing, and that importing it stays cheap for the agent."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pko.git import GitCredentials, GitURLError, parse_remote, redact_text, redact_url
from pko.git.remote import is_remote_helper


def test_credentials_never_show_a_value() -> None:
    creds = GitCredentials("bob", "hunter22", "tok-secret", "-----BEGIN KEY-----", "host ssh-ed25519 AAA")
    text = repr(creds) + str(creds)
    for value in ("hunter22", "tok-secret", "BEGIN KEY", "AAA"):
        assert value not in text
    assert "password" in text and "known_hosts" in text  # which are set, not what they are
    assert set(creds.secrets()) == {"hunter22", "tok-secret", "-----BEGIN KEY-----"}


def test_fingerprints_differ_for_any_field_and_match_for_equal_credentials() -> None:
    base = GitCredentials(token="t")
    assert base.fingerprint() == GitCredentials(token="t").fingerprint()
    others = [
        GitCredentials(token="u"),
        GitCredentials(username="t"),
        GitCredentials(token="t", known_hosts="h"),
    ]
    assert len({base.fingerprint(), *(c.fingerprint() for c in others)}) == 4


def test_basic_auth_prefers_a_token_then_username_and_password_then_the_url() -> None:
    assert GitCredentials(token="t").basic_auth("u", "p") == ("u", "t")
    assert GitCredentials(token="t").basic_auth() == ("git", "t")
    assert GitCredentials(username="a", password="b").basic_auth("u", "p") == ("a", "b")
    assert GitCredentials().basic_auth("u", "p") == ("u", "p")


def test_an_ssh_keys_passphrase_is_never_sent_to_an_http_server() -> None:
    """sshAuth's password is the key's passphrase: an HTTPS remote of such a Stack gets no password
    from it (the URL's own user, if any, and nothing else)."""
    key = "-----BEGIN KEY-----"
    assert GitCredentials(password="phrase", ssh_private_key=key).basic_auth() == (None, None)
    assert GitCredentials(password="phrase", ssh_private_key=key).basic_auth("u", "p") == ("u", "p")
    assert GitCredentials(username="a", password="phrase", ssh_private_key=key).basic_auth() == ("a", None)


@pytest.mark.parametrize(
    ("url", "transport", "host"),
    [
        ("https://bob:pw@example.com/r.git", "http", "example.com"),
        ("ssh://git@example.com:2222/r.git", "ssh", "example.com"),
        ("git@example.com:org/r.git", "ssh", "example.com"),
        ("[::1]:r.git", "ssh", "::1"),
        ("git@example.com:r::x", "ssh", "example.com"),  # "::" in the path: still scp-like for git
        ("example.com:r::x", "ssh", "example.com"),
        ("https://example.com/r::x", "http", "example.com"),
        ("git://example.com/r.git", "other", "example.com"),
        ("file:///srv/r.git", "local", None),
        ("/srv/r.git", "local", None),
    ],
)
def test_url_forms_git_clones_from(url: str, transport: str, host: str | None) -> None:
    remote = parse_remote(url)
    assert (remote.transport, remote.host) == (transport, host)
    assert "pw" not in remote.url and "pw@" not in remote.display


@pytest.mark.parametrize(
    "url",
    [
        "ftp://u:s3cret@example.com/r",
        "git://u:s3cret@/r",
        "https://u:s3cret@example.com:port/r",
        "u:s3cret@:r.git",
        "s3cret.example.com/r",
        "ext::git-remote-https https://u:s3cret@example.com/r",
    ],
)
def test_refused_urls_are_not_repeated_in_the_message(url: str) -> None:
    with pytest.raises(GitURLError) as info:
        parse_remote(url)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "ext::sh -c touch% pwned",
        "fd::17",
        "fd::17/r",
        "foo::bar",
        "a.b+c-9::x",
        "https::https://example.com/r",
    ],
)
def test_remote_helper_urls_are_refused_before_the_scp_like_rule(url: str) -> None:
    # git's transport rule: <transport>::<address> runs git-remote-<transport> (ext:: runs a command)
    with pytest.raises(GitURLError) as info:
        parse_remote(url)
    message = str(info.value)
    assert message.startswith("git remote-helper URLs (<transport>::<address>, such as ext:: or fd::)")
    assert "https://, http://, ssh://" in message  # what works instead
    assert url not in message and "pwned" not in message and "a.b+c" not in message
    assert is_remote_helper(url)


@pytest.mark.parametrize(
    "url",
    ["git@example.com:r::x", "example.com:r::x", "https://example.com/r::x", "[::1]:r", "-x::y", "/srv/a::b"],
)
def test_a_colon_colon_after_anything_but_a_transport_name_is_no_remote_helper(url: str) -> None:
    assert not is_remote_helper(url)


def test_redaction() -> None:
    assert redact_url("https://bob:pw@example.com/r?sig=1") == "https://bob:***@example.com/r?***"
    assert (
        redact_text("at https://bob:pw@x/r with tok-secret", ["tok-secret"])
        == "at https://bob:***@x/r with ***"
    )


def test_importing_pko_git_loads_nothing_the_agent_does_not() -> None:
    code = (
        "import sys, pko.git; heavy = [m for m in ('dulwich.porcelain', 'pydantic', 'aiohttp', "
        "'kubernetes_asyncio', 'pko.agent', 'pko.api') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
