"""Config command handlers (``pulumi config ...``): the stack's settings file, read and written as the
real CLI does; output shapes follow pkg/cmd/pulumi (JSON printed with two-space indentation)."""

from __future__ import annotations

import json
from typing import Any

from . import config as cfgmod
from .cli import Parsed
from .commands import print_json
from .errors import EXIT_CONFIGURATION, CliError
from .stackctx import Context, StackContext, resolve_stack


def config_ls(ctx: Context, p: Parsed) -> int:
    sc = resolve_stack(ctx, p.flag("stack"))
    cfg = sc.config
    show = p.bool("show-secrets")

    def dec(ct: str) -> str:
        return sc.decrypt(ct) if show else "[secret]"

    if p.bool("json"):
        try:
            print_json({k: cfgmod.json_entry(cfg[k], dec, show) for k in sorted(cfg)})
        except CliError as exc:
            raise CliError(f"could not decrypt configuration values: {exc.message}") from exc
    else:
        print("KEY  VALUE")
        for key in sorted(cfg):
            print(
                f"{key.split(':', 1)[1] if key.startswith(sc.project.name + ':') else key}  "
                f"{cfgmod.value_text(cfg[key], dec)}"
            )
    return 0


def config_get(ctx: Context, p: Parsed) -> int:
    sc = resolve_stack(ctx, p.flag("stack"))
    if not p.args:
        raise CliError("accepts 1 arg(s), received 0", EXIT_CONFIGURATION)
    key = cfgmod.parse_config_key(p.args[0], p.bool("path"), sc.project.name)
    cfg = sc.config
    raw: Any
    if p.bool("path"):
        ns, name = cfgmod.split_key(key)
        segments = cfgmod.parse_property_path(name)
        raw = cfg.get(f"{ns}:{segments[0]}")
        for seg in segments[1:]:
            if isinstance(raw, dict) and isinstance(seg, str) and seg in raw:
                raw = raw[seg]
            elif isinstance(raw, list) and isinstance(seg, int) and seg < len(raw):
                raw = raw[seg]
            else:
                raw = None
                break
    else:
        raw = cfg.get(key)
    if raw is None:
        raise CliError(f"configuration key '{p.args[0]}' not found for stack '{sc.shown_name}'")
    if p.bool("json"):
        print_json(cfgmod.json_entry(raw, sc.decrypt, True))
    else:
        print(cfgmod.value_text(raw, sc.decrypt))
    return 0


def _secret_or_plain(sc: StackContext, value: str, secret: bool) -> Any:
    return {"secure": sc.encrypt(value)} if secret else value


def config_set(ctx: Context, p: Parsed) -> int:
    sc = resolve_stack(ctx, p.flag("stack"))
    if not p.args:
        raise CliError("accepts between 1 and 2 arg(s), received 0", EXIT_CONFIGURATION)
    if p.bool("secret") and p.bool("plaintext"):
        raise CliError("only one of --secret and --plaintext may be specified")
    key = cfgmod.parse_config_key(p.args[0], p.bool("path"), sc.project.name)
    if len(p.args) < 2:
        raise CliError("value must be specified in non-interactive mode")
    cfgmod.set_value(sc.config, key, _secret_or_plain(sc, p.args[1], p.bool("secret")), p.bool("path"))
    sc.save_settings()
    return 0


def _parse_pair(pair: str) -> tuple[str, str]:
    text = pair
    if text[:1] in ("'", '"'):
        quote = text[0]
        key, sep, value = text[1:].partition(quote + "=")
    else:
        key, sep, value = text.partition("=")
    if not sep:
        raise CliError("config value must be in the form [key]=[value]")
    return key, value


def config_set_all(ctx: Context, p: Parsed) -> int:
    json_arg = p.flag("json")
    if json_arg and (p.list("plaintext") or p.list("secret") or p.bool("path")):
        raise CliError("the --json option cannot be used with the --plaintext, --secret or --path options")
    sc = resolve_stack(ctx, p.flag("stack"))
    path = p.bool("path")
    project = sc.project.name
    for pair in p.list("plaintext"):
        key, value = _parse_pair(pair)
        cfgmod.set_value(sc.config, cfgmod.parse_config_key(key, path, project), value, path)
    for pair in p.list("secret"):
        key, value = _parse_pair(pair)
        cfgmod.set_value(
            sc.config, cfgmod.parse_config_key(key, path, project), {"secure": sc.encrypt(value)}, path
        )
    if json_arg:
        try:
            document = json.loads(json_arg)
        except ValueError as exc:
            raise CliError(f"could not parse --json argument: {exc}") from exc
        for json_key, entry in document.items():
            if entry.get("value") is None:
                raise CliError(f"value for --json object key {json_key!r} is nil")
            key = cfgmod.parse_config_key(json_key, False, project)
            secret = bool(entry.get("secret"))
            if entry.get("objectValue") is not None:
                obj = entry["objectValue"]
                raw = cfgmod.encrypt_object(obj, sc.encrypt) if secret else obj
            else:
                raw = _secret_or_plain(sc, str(entry["value"]), secret)
            sc.config[key] = raw
    sc.save_settings()
    return 0


def config_rm(ctx: Context, p: Parsed) -> int:
    sc = resolve_stack(ctx, p.flag("stack"))
    if not p.args:
        raise CliError("accepts 1 arg(s), received 0", EXIT_CONFIGURATION)
    cfgmod.remove_value(
        sc.config, cfgmod.parse_config_key(p.args[0], p.bool("path"), sc.project.name), p.bool("path")
    )
    sc.save_settings()
    return 0


def config_rm_all(ctx: Context, p: Parsed) -> int:
    sc = resolve_stack(ctx, p.flag("stack"))
    for arg in p.args:
        cfgmod.remove_value(
            sc.config, cfgmod.parse_config_key(arg, p.bool("path"), sc.project.name), p.bool("path")
        )
    sc.save_settings()
    return 0


def config_refresh(ctx: Context, p: Parsed) -> int:
    sc = resolve_stack(ctx, p.flag("stack"))
    history = sc.backend.history(sc.ref)
    if not history:
        raise CliError("no previous deployment")
    restored: dict[str, Any] = {}
    for key, value in (history[0].get("config") or {}).items():
        text = value.get("string", "")
        if value.get("object"):
            restored[key] = json.loads(text)
        else:
            restored[key] = {"secure": text} if value.get("secret") else text
    sc.settings["config"] = restored
    sc.save_settings()
    return 0


def config_env(ctx: Context, p: Parsed) -> int:
    import socket

    if p.path[-1] in ("add", "rm") and not p.bool("yes"):
        raise CliError("non-interactive mode requires --yes flag", EXIT_CONFIGURATION)
    resolve_stack(ctx, p.flag("stack"))
    raise CliError(
        f"backend {socket.gethostname()} does not support environments; Pulumi ESC environments require the "
        "Pulumi Cloud backend, use `pulumi login` without arguments to log into the Pulumi Cloud backend"
    )
