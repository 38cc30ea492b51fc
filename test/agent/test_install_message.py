# ruff: noqa: E501 (the samples are the tools' output, verbatim)
"""What a user reads when `pulumi install` fails (pko.agent.failures.install_message): the package
manager's or toolchain's own words, never only the engine's "exit status 1"."""

from __future__ import annotations

from pko.agent.failures import install_message

RUNTIMES = ["go", "nodejs", "python", "yaml"]

# `pulumi install` of a Node.js program whose dependency the registry lacks (npm 11's words).
NPM_404 = """\
Installing dependencies...

npm error code E404
npm error 404 Not Found - GET http://10.87.0.1:40125/pko-e2e-absent - Not found
npm error 404
npm error 404  The requested resource 'pko-e2e-absent@1.0.0' could not be found or you do not have permission to access it.
npm error 404
npm error 404 Note that you can also install from a
npm error 404 tarball, folder, http url, or git url.
npm error A complete log of this run can be found in: /home/pulumi/.npm/_logs/2026-11-27T08_00_00_000Z-debug-0.log
error: exit status 1
"""

GO_TIDY = """\
Installing dependencies...

go: downloading github.com/pulumi/pulumi/sdk/v3 v3.274.1
go: example.com/prog imports
	github.com/pulumi/pulumi/sdk/v3/go/pulumi: github.com/pulumi/pulumi/sdk/v3@v3.274.1: Get "https://proxy.golang.org/...": dial tcp: lookup proxy.golang.org: no such host
error: `go mod tidy` failed to install dependencies: exit status 1
"""


def test_a_missing_npm_package_is_named_with_the_registrys_answer() -> None:
    message = install_message(NPM_404, RUNTIMES)
    assert message.startswith(
        "exit status 1: code E404; 404 Not Found - GET http://10.87.0.1:40125/pko-e2e-absent"
    )
    assert "'pko-e2e-absent@1.0.0' could not be found" in message
    assert "complete log" not in message and "tarball, folder" not in message


def test_go_says_which_module_it_could_not_download() -> None:
    message = install_message(GO_TIDY, RUNTIMES)
    assert message.startswith("`go mod tidy` failed to install dependencies: exit status 1: ")
    assert "example.com/prog imports github.com/pulumi/pulumi/sdk/v3/go/pulumi:" in message
    assert "lookup proxy.golang.org: no such host" in message


def test_a_runtime_without_a_language_host_lists_the_images_runtimes() -> None:
    text = "error: load language plugin nodjs: no language plugin 'pulumi-language-nodjs' found in the workspace\n"
    message = install_message(text, RUNTIMES)
    assert message.startswith(
        "runtime 'nodjs' has no language host in this workspace image (it runs: go, nodejs,"
    )
    assert "pulumi-language-nodjs" in message and "Pulumi.yaml" in message


def test_without_tool_lines_the_engines_error_is_the_message() -> None:
    assert (
        install_message("some output\nerror: could not read Pulumi.yaml\n", RUNTIMES)
        == "could not read Pulumi.yaml"
    )
    assert install_message("", RUNTIMES) == "the install failed"
