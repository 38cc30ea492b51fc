"""Command handlers (the config commands are configcommands.py's). Output shapes follow pkg/cmd/pulumi (JSON
printed with two-space indentation)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from . import config as cfgmod
from . import workspace
from .backend import current_user, parse_stack_ref
from .cli import Parsed
from .engine import Engine
from .errors import EXIT_CONFIGURATION, CliError, StackNotFound
from .importing import (
    Declaration,
    ImportSpec,
    generate_yaml,
    read_import_file,
    specs_from_args,
    validate_entries,
)
from .providers import canonical_type, provider_for
from .request import Request
from .stackctx import Context, StackContext, open_backend, resolve_stack
from .values import mask_state, state_has_secrets, to_plaintext_state
from .version import cli_version


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _format_time(unix: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(unix))


# -- basics -----------------------------------------------------------------------------------------------
def version(ctx: Context, p: Parsed) -> int:
    print(f"v{cli_version()}")
    return 0


def whoami(ctx: Context, p: Parsed) -> int:
    url = workspace.backend_url(workspace.find_project(ctx.cwd))
    user = current_user()
    if p.bool("json"):
        print_json({"user": user, "url": url})
    else:
        print(user)
    return 0


def login(ctx: Context, p: Parsed) -> int:
    url = p.args[0] if p.args else ("file://~" if p.bool("local") else p.flag("cloud-url"))
    if not url or not url.startswith("file://"):
        raise CliError("the fake pulumi CLI can only log in to file:// backends")
    creds = workspace.read_credentials()
    creds["current"] = url
    workspace.write_credentials(creds)
    print(f"Logged in to {current_user()} as {current_user()} ({url})")
    return 0


def logout(ctx: Context, p: Parsed) -> int:
    creds = workspace.read_credentials()
    creds.pop("current", None)
    workspace.write_credentials(creds)
    print("Logged out")
    return 0


# -- stacks -------------------------------------------------------------------------------------------------
def _init_stack(ctx: Context, name: str, secrets_provider: str | None, select: bool) -> None:
    project = workspace.require_project(ctx.cwd)
    backend = open_backend(ctx, project)
    ref = parse_stack_ref(name, project.name)
    if secrets_provider not in (None, "", "default", "passphrase"):
        raise CliError(
            f"the fake pulumi CLI only supports the passphrase secrets provider, not {secrets_provider!r}"
        )
    if backend.exists(ref):
        raise CliError(f"stack '{ref.display(project.name)}' already exists")
    sc = StackContext(
        project=project, backend=backend, ref=ref, settings=workspace.load_stack_settings(project, ref.name)
    )
    sc.crypter()  # the passphrase provider needs PULUMI_CONFIG_PASSPHRASE at init, as in the real CLI
    backend.create(ref, ref.display(project.name), sc.secrets_provider_state())
    if select:
        workspace.set_current_stack(project, ref.fq_name)


def stack_init(ctx: Context, p: Parsed) -> int:
    name = p.args[0] if p.args else p.flag("stack")
    if not name:
        raise CliError("a stack name is required in non-interactive mode", EXIT_CONFIGURATION)
    _init_stack(ctx, name, p.flag("secrets-provider"), select=not p.bool("no-select"))
    print(f"Created stack '{name}'")
    return 0


def stack_select(ctx: Context, p: Parsed) -> int:
    name = p.args[0] if p.args else p.flag("stack")
    if not name:
        raise CliError("no stack selected; specify a stack name with --stack", 6)
    project = workspace.require_project(ctx.cwd)
    backend = open_backend(ctx, project)
    ref = parse_stack_ref(name, project.name)
    if backend.exists(ref):
        workspace.set_current_stack(project, ref.fq_name)
        return 0
    if p.bool("create"):
        _init_stack(ctx, name, p.flag("secrets-provider"), select=True)
        return 0
    raise StackNotFound(ref.display(project.name))


def stack_ls(ctx: Context, p: Parsed) -> int:
    project = workspace.find_project(ctx.cwd)
    backend = open_backend(ctx, project)
    filter_project = None if p.bool("all") or project is None else project.name
    current = workspace.current_stack(project) if project else None
    rows = []
    for ref in backend.list_stacks(p.flag("project") or filter_project):
        deployment = backend.load_deployment(ref)
        history = backend.history(ref)
        row: dict[str, Any] = {
            "name": ref.display(None if ctx.fully_qualify else (project.name if project else None)),
            "current": ref.fq_name == current,
        }
        if history:
            row["lastUpdate"] = _format_time(history[0].get("endTime") or history[0]["startTime"])
        if deployment.get("resources") is not None or history:
            row["resourceCount"] = len(deployment.get("resources") or [])
        rows.append(row)
    if p.bool("json"):
        print_json(rows)
    else:
        print("NAME  LAST UPDATE  RESOURCE COUNT")
        for row in rows:
            print(
                f"{row['name']}{'*' if row['current'] else ''}  {row.get('lastUpdate', 'n/a')}  "
                f"{row.get('resourceCount', 'n/a')}"
            )
    return 0


def stack_rm(ctx: Context, p: Parsed) -> int:
    if not p.bool("yes"):
        raise CliError(
            "--yes must be passed in to proceed when running in non-interactive mode", EXIT_CONFIGURATION
        )
    sc = resolve_stack(ctx, p.args[0] if p.args else p.flag("stack"))
    sc.backend.remove(sc.ref, force=p.bool("force"))
    if not p.bool("preserve-config"):
        workspace.stack_settings_path(sc.project, sc.ref.name).unlink(missing_ok=True)
    if workspace.current_stack(sc.project) == sc.ref.fq_name:
        workspace.set_current_stack(sc.project, None)
    print("Stack has been removed!")
    return 0


def _stack_outputs(sc: StackContext) -> dict[str, Any]:
    for res in sc.backend.load_deployment(sc.ref).get("resources") or []:
        if res.get("type") == "pulumi:pulumi:Stack":
            outputs = res.get("outputs") or {}
            return outputs if isinstance(outputs, dict) else {}
    return {}


def stack_output(ctx: Context, p: Parsed) -> int:
    sc = resolve_stack(ctx, p.flag("stack"))
    raw = _stack_outputs(sc)
    if p.bool("show-secrets"):
        from .values import from_state, plain

        outputs = plain(from_state(raw, sc.decrypt)) if state_has_secrets(raw) else raw
    else:
        outputs = mask_state(raw)
    if p.args:
        name = p.args[0]
        if name not in outputs:
            raise CliError(f"current stack does not have output property '{name}'")
        outputs = outputs[name]
    if p.bool("json"):
        print_json(outputs)
    elif isinstance(outputs, dict):
        print("Current stack outputs:")
        for key in sorted(outputs):
            print(f"    {key}  {outputs[key]}")
    else:
        print(outputs)
    return 0


def _history_config(entry: dict[str, Any], sc: StackContext, show_secrets: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (entry.get("config") or {}).items():
        item: dict[str, Any] = {"secret": bool(value.get("secret"))}
        if not item["secret"] or show_secrets:
            text = value.get("string", "")
            if value.get("object"):
                obj = json.loads(text) if text else None
                obj = cfgmod.decrypt(obj, sc.decrypt) if item["secret"] else obj
                item["value"] = json.dumps(obj, separators=(",", ":"))
                item["objectValue"] = obj
            else:
                item["value"] = sc.decrypt(text) if item["secret"] else text
        out[key] = {k: item[k] for k in ("value", "objectValue", "secret") if k in item}
    return out


def stack_history(ctx: Context, p: Parsed) -> int:
    sc = resolve_stack(ctx, p.flag("stack"))
    entries = sc.backend.history(sc.ref)
    page_size, page = int(p.flag("page-size") or 10), int(p.flag("page") or 1)
    if p.flag("page-size") is not None:
        entries = entries[(page - 1) * page_size : page * page_size]
    rendered = []
    for entry in entries:
        item: dict[str, Any] = {
            "version": entry["version"],
            "kind": entry["kind"],
            "startTime": _format_time(entry["startTime"]),
            "message": entry.get("message", ""),
            "environment": entry.get("environment") or {},
            "config": _history_config(entry, sc, p.bool("show-secrets")),
            "result": entry["result"],
        }
        if entry["result"] != "in-progress":
            item["endTime"] = _format_time(entry["endTime"])
            item["resourceChanges"] = entry.get("resourceChanges") or {}
        rendered.append(item)
    if p.bool("json"):
        print_json(rendered)
    else:
        for item in rendered:
            print(f"Version: {item['version']}\nUpdateKind: {item['kind']}\nStatus: {item['result']}\n")
    return 0


def stack_export(ctx: Context, p: Parsed) -> int:
    sc = resolve_stack(ctx, p.flag("stack"))
    deployment = sc.backend.load_deployment(sc.ref)
    if p.bool("show-secrets") and state_has_secrets(deployment):
        from .values import from_state

        deployment = to_plaintext_state(from_state(deployment, sc.decrypt))
    document = {"version": 3, "deployment": deployment}
    target = p.flag("file")
    if target:
        Path(target).write_text(json.dumps(document, indent=4) + "\n", encoding="utf-8")
    else:
        print_json(document)
    return 0


def stack_import(ctx: Context, p: Parsed) -> int:
    sc = resolve_stack(ctx, p.flag("stack"))
    source = p.flag("file")
    text = Path(source).read_text(encoding="utf-8") if source else sys.stdin.read()
    document = json.loads(text)
    if document.get("version") != 3 or not isinstance(document.get("deployment"), dict):
        raise CliError("could not import deployment: unsupported deployment version")
    deployment = document["deployment"]
    if state_has_secrets(deployment):
        from .values import from_state, to_state

        deployment = to_state(from_state(deployment, sc.decrypt), sc.encrypt)
    # The real CLI clears pending operations on import and says so.
    for op in deployment.pop("pending_operations", None) or []:
        print(
            f"warning: removing pending operation '{op.get('type')}' on '{op['resource']['urn']}' "
            "from snapshot",
            file=sys.stderr,
        )
    sc.backend.lock(sc.ref)
    try:
        sc.backend.save_checkpoint(sc.ref, deployment)
    finally:
        sc.backend.unlock(sc.ref)
    print("Import complete.")
    return 0


def cancel(ctx: Context, p: Parsed) -> int:
    if p.args and p.flag("stack"):
        raise CliError("only one of --stack or argument stack name may be specified, not both")
    sc = resolve_stack(ctx, p.args[0] if p.args else p.flag("stack"))
    sc.backend.cancel(sc.ref)
    print(f"The currently running update for '{sc.ref.name}' has been canceled!")
    return 0


# -- install / plugins ------------------------------------------------------------------------------------
def install(ctx: Context, p: Parsed) -> int:
    project = workspace.require_project(ctx.cwd)
    if project.runtime != "yaml":
        raise CliError(
            "installing dependencies failed: the fake pulumi CLI cannot install a "
            f"'{project.runtime}' project "
            "(only runtime: yaml is modelled)"
        )
    print("Installing plugins...")
    print("Finished installing dependencies")
    return 0


def plugin_ls(ctx: Context, p: Parsed) -> int:
    if p.bool("json"):
        print_json([])
    return 0


def plugin_install(ctx: Context, p: Parsed) -> int:
    return 0


# -- operations --------------------------------------------------------------------------------------
_NO_CONFIRMATION = (
    "--yes or --skip-preview or --preview-only must be passed in to proceed when running in "
    "non-interactive mode"
)


def _operation(ctx: Context, p: Parsed, kind: str, dry_run: bool) -> int:
    if p.flag("client"):
        raise CliError("the fake pulumi CLI does not run inline programs (--client)")
    if p.list("exclude"):
        raise CliError("the fake pulumi CLI does not model --exclude")
    if not dry_run and not (p.bool("yes") or p.bool("skip-preview")):
        raise CliError(_NO_CONFIRMATION, EXIT_CONFIGURATION)
    sc = resolve_stack(ctx, p.flag("stack"))
    request = Request(
        kind=kind,
        dry_run=dry_run,
        message=p.flag("message") or "",
        exec_kind=p.flag("exec-kind") or "cli",
        event_log=p.flag("event-log"),
        replace=p.list("replace"),
        clear_pending_creates=p.bool("clear-pending-creates"),
        show_secrets=p.bool("show-secrets"),
        remove=p.bool("remove"),
        targets=p.list("target"),
        target_dependents=p.bool("target-dependents"),
        expect_no_changes=p.bool("expect-no-changes"),
        refresh=kind == "update" and p.bool("refresh"),
    )
    Engine(sc, request).run()
    return 0


def preview(ctx: Context, p: Parsed) -> int:
    return _operation(ctx, p, "update", dry_run=True)


def up(ctx: Context, p: Parsed) -> int:
    return _operation(ctx, p, "update", dry_run=False)


def refresh(ctx: Context, p: Parsed) -> int:
    return _operation(ctx, p, "refresh", dry_run=p.bool("preview-only"))


def destroy(ctx: Context, p: Parsed) -> int:
    return _operation(ctx, p, "destroy", dry_run=p.bool("preview-only"))


# -- import -----------------------------------------------------------------------------------------
_COPY_NOTICE = (
    "Please copy the following code into your Pulumi application. Not doing so\n"
    "will cause Pulumi to report that an update will happen on the next update command.\n\n"
)
_PROTECT_NOTICE = (
    "Please note that the imported resources are marked as protected. To destroy them\n"
    "you will need to remove the `protect` option and run `pulumi update` *before*\n"
    "the destroy will take effect.\n\n"
)


def _default_true(p: Parsed, name: str) -> bool:
    """A boolean flag that defaults to true (``--protect``, ``--generate-code``)."""
    return p.bool(name) if name in p.flags else True


def _import_request(p: Parsed) -> list[ImportSpec] | list[dict[str, Any]]:
    """The inline resource, or the import file's raw entries (validated once the stack is known)."""
    for option in ("parent", "provider"):
        if p.flag(option):
            raise CliError(f"the fake pulumi CLI does not model import --{option}")
    if p.list("properties"):
        raise CliError("the fake pulumi CLI does not model import --properties")
    inline = specs_from_args(p.args, bool(p.flag("file")), bool(p.flag("from")))
    return inline if inline is not None else read_import_file(p.flag("file") or "")


def import_(ctx: Context, p: Parsed) -> int:
    """``pulumi import``: an engine run adding existing resources, then their generated declarations
    (stdout, after the copy notices, or the ``--out`` file, which is created up front)."""
    project = workspace.require_project(ctx.cwd)
    requested = _import_request(p)
    generate, out = _default_true(p, "generate-code"), p.flag("out")
    if not generate and out:
        print("Output file will not be used as --generate-code is false.", file=sys.stderr)
    if out:
        Path(out).write_text("", encoding="utf-8")
    if not (p.bool("yes") or p.bool("skip-preview") or p.bool("preview-only")):
        raise CliError(_NO_CONFIRMATION, EXIT_CONFIGURATION)
    sc = resolve_stack(ctx, p.flag("stack"))
    specs = [r for r in requested if isinstance(r, ImportSpec)] or validate_entries(
        [r for r in requested if isinstance(r, dict)]
    )
    for spec in specs:
        if provider_for(spec.type) is None:
            raise CliError(f"unknown resource type {spec.type!r}: the fake pulumi CLI has no provider for it")
    request = Request(
        kind="import",
        dry_run=p.bool("preview-only"),
        message=p.flag("message") or "",
        exec_kind=p.flag("exec-kind") or "cli",
        event_log=p.flag("event-log"),
        imports=specs,
        protect_imports=_default_true(p, "protect"),
    )
    error: CliError | None = None
    try:
        Engine(sc, request).run()
    except CliError as exc:
        error = exc
    if generate and project.runtime:
        _write_imported_code(sc, specs, request.protect_imports, out, quiet=p.bool("json"))
    if error is not None:
        raise error
    return 0


def _write_imported_code(
    sc: StackContext, specs: list[ImportSpec], protect: bool, out: str | None, quiet: bool
) -> None:
    """generateImportedDefinitions: declarations for the imports now in the state, if any."""
    from .values import from_state, plain

    states = {r["urn"]: r for r in sc.backend.load_deployment(sc.ref).get("resources") or []}
    found = []
    for spec in specs:
        state = states.get(
            f"urn:pulumi:{sc.ref.name}::{sc.project.name}::{canonical_type(spec.type)}::{spec.urn_name}"
        )
        if state is not None and not state.get("delete"):
            inputs = plain(from_state(state.get("inputs") or {}, sc.decrypt))
            found.append(Declaration(spec.name, spec.urn_name, state["type"], inputs, protect))
    if not found:
        return
    code = generate_yaml(found)
    if out:
        Path(out).write_text(code, encoding="utf-8")
    elif not quiet:
        sys.stdout.write(_COPY_NOTICE + (_PROTECT_NOTICE if protect else "") + code)
        sys.stdout.flush()
