"""The agent's command line: flags like the Go agent, the env file, `serve` as a process."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pko.agent.cli import build_parser, read_env_file
from pko.api.generated.pko.agent import v1 as pb

from pko.devtools.agents import agent_env, collect, free_port, health, spawn, stop_process, wait_for_agent
from pko.devtools.standin import make_fake_pulumi


def agent(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pko.agent", *args],
        capture_output=True,
        text=True,
        env=env or agent_env(),
        timeout=timeout,
    )


def test_serve_takes_the_go_agents_flags() -> None:
    args = build_parser().parse_args(
        [
            "serve", "--workspace", "/share/workspace", "--skip-install", "--env-file", "/share/.env",
            "--auth-mode", "kube", "--kube-audience", "ws.ns", "--kube-workspace-namespace", "ns",
            "--kube-workspace-name", "ws", "--pulumi-log-level", "3",
        ]
    )  # fmt: skip
    assert args.workspace == Path("/share/workspace")
    assert args.skip_install and args.env_file == Path("/share/.env")
    assert (args.auth_mode, args.kube_audience) == ("kube", ["ws.ns"])
    assert (args.kube_workspace_namespace, args.kube_workspace_name) == ("ns", "ws")
    assert args.pulumi_log_level == 3
    assert (args.host, args.port) == ("0.0.0.0", 50051)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--kube-audience is required"),
        (["--kube-audience", "a"], "--kube-workspace-namespace is required"),
        (["--kube-audience", "a", "--kube-workspace-namespace", "n"], "--kube-workspace-name is required"),
    ],
)
def test_kube_auth_mode_requires_its_settings(tmp_path: Path, extra: list[str], message: str) -> None:
    env = {k: v for k, v in agent_env().items() if k not in ("WORKSPACE_NAMESPACE", "WORKSPACE_NAME")}
    proc = agent("serve", "--workspace", str(tmp_path), "--auth-mode", "kube", *extra, env=env)
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.parametrize(
    ("kubeconfig", "env", "message"),
    [
        (
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"exec": {"command": "aws-iam-authenticator"}}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            },
            {},
            "user 'u': 'exec' is not supported by the agent",
        ),
        (None, {}, "not in a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset)"),
        (
            None,
            {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"},
            "cannot load the cluster CA",
        ),
    ],
    ids=["exec-plugin", "no-settings", "in-cluster-without-files"],
)
def test_kube_auth_settings_it_cannot_use_end_serve_with_the_reason(
    tmp_path: Path, kubeconfig: dict[str, object] | None, env: dict[str, str], message: str
) -> None:
    if env and Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt").exists():
        pytest.skip("this machine has in-cluster settings of its own")
    base = {
        k: v for k, v in agent_env().items() if k != "KUBECONFIG" and not k.startswith("KUBERNETES_SERVICE")
    }
    flags = ["--auth-mode", "kube", "--kube-audience", "a", "--kube-workspace-namespace", "n"]
    flags += ["--kube-workspace-name", "w"]
    if kubeconfig is not None:
        path = tmp_path / "kubeconfig"
        path.write_text(json.dumps(kubeconfig))
        flags += ["--kubeconfig", str(path)]
    proc = agent("serve", "--workspace", str(tmp_path), *flags, env={**base, **env})
    assert proc.returncode == 2, proc.stderr
    assert "agent: --auth-mode kube: " in proc.stderr and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_leading_double_dash_is_ignored_as_tini_passes_it(tmp_path: Path) -> None:
    proc = agent("--", "serve", "--workspace", str(tmp_path / "missing"))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr


def test_init_is_wired_to_the_source_fetcher() -> None:
    proc = agent("init", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: agent init" in proc.stdout


def test_a_missing_pulumi_cli_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: p\nruntime: yaml\n")
    env = {**agent_env(), "PATH": "/nonexistent"}
    proc = agent("serve", "--workspace", str(tmp_path), "--port", str(free_port()), env=env)
    assert proc.returncode == 1
    assert "the pulumi CLI was not found" in proc.stderr


def test_env_file_parsing(tmp_path: Path) -> None:
    f = tmp_path / ".env"
    f.write_text(
        "# comment\n\nPLAIN=value\nexport EXPORTED=yes\nQUOTED=\"two words\\n\"\nSINGLE='$not expanded'\n"
        "SPACED = padded \nTRAILING=v # note\nEMPTY=\n"
    )
    assert read_env_file(f) == {
        "PLAIN": "value",
        "EXPORTED": "yes",
        "QUOTED": "two words\n",
        "SINGLE": "$not expanded",
        "SPACED": "padded",
        "TRAILING": "v",
        "EMPTY": "",
    }
    bad = tmp_path / "bad.env"
    bad.write_text("NOEQUALS\n")
    with pytest.raises(ValueError, match=r"bad\.env:1"):
        read_env_file(bad)


async def test_serve_answers_health_and_uses_the_env_file(tmp_path: Path) -> None:
    fake = make_fake_pulumi(tmp_path / "pulumi")
    work = tmp_path / "share" / "workspace"
    work.mkdir(parents=True)
    (work / "Pulumi.yaml").write_text("name: envy\nruntime: yaml\noutputs:\n  token: ${token}\n")
    env_file = tmp_path / "share" / ".env"
    env_file.write_text(
        f"PULUMI_BACKEND_URL={fake.backend_url}\nPULUMI_CONFIG_PASSPHRASE={fake.passphrase}\n"
        f"PULUMI_HOME={fake.home}\nAPI_TOKEN=from-env-file\n"
    )
    port = free_port()
    proc = spawn(
        [
            sys.executable, "-m", "pko.agent", "serve", "--workspace", str(work), "--skip-install",
            "--env-file", str(env_file), "--stack", "dev", "--host", "127.0.0.1", "--port", str(port),
            "--pulumi-root", str(fake.root),
        ],
        agent_env(),
    )  # fmt: skip
    try:
        channel, _ = await wait_for_agent(proc, port, health)
        stub = pb.AutomationServiceStub(channel)
        await stub.set_all_config(
            pb.SetAllConfigRequest(
                config=[
                    pb.ConfigItem(key="token", value_from=pb.ConfigValueFrom(env="API_TOKEN"), secret=True)
                ]
            )
        )
        _, result = collect([e async for e in stub.up(pb.UpRequest(operation_id="env-1"))])
        channel.close()
        assert result is not None and result.state == pb.OperationState.SUCCEEDED, result
        assert json.loads(result.outputs["token"].value) == "from-env-file"
        assert result.outputs["token"].secret
        # The journal lives beside the workspace (/share/.agent in a pod).
        assert (tmp_path / "share" / ".agent" / "operations" / "env-1" / "result.json").exists()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 120) == 0
    finally:
        stop_process(proc)
