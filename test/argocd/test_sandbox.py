"""The emulation of Argo CD's Lua environment (sandbox.py) is as narrow as Argo CD's: what the Stack
scripts are tested in must refuse what Argo CD refuses, or a passing test proves nothing."""

from __future__ import annotations

import pytest

from pko.devtools.argocd import Health, LuaScriptError, Scripts, discover, health, run, run_action


@pytest.mark.parametrize(
    "expression",
    ["string.format('%d', 1)", "('abc'):sub(1, 1)", "math.floor(1.5)", "io.write('x')", "os.getenv('HOME')",
     "os.exit(1)", "require('string')", "debug.traceback()", "coroutine.create(print)"],
)  # fmt: skip
def test_libraries_argo_cd_does_not_open_are_missing(expression: str) -> None:
    with pytest.raises(LuaScriptError):
        run(f"local x = {expression}\nreturn {{}}", {})


def test_what_argo_cd_opens_is_there() -> None:
    script = """
    local t = {}
    table.insert(t, tostring(os.time() > 0))
    table.insert(t, os.date("!%Y"))
    table.insert(t, tostring(require("os").date ~= nil))
    table.insert(t, _VERSION)
    table.insert(t, tostring(2) .. "/" .. tostring(obj.n) .. "/" .. tostring(obj.f))
    return t
    """
    got = run(script, {"n": 3, "f": 1.5})
    assert got[0] == "true" and len(got[1]) == 4 and got[2] == "true"
    assert got[3] == "Lua 5.1"  # gopher-lua's language: no integer subtype, so 3 prints as "3"
    assert got[4] == "2/3/1.5"


def test_null_is_nil_in_maps_and_dropped_from_lists() -> None:
    got = run("return {obj.a == nil, #obj.l, obj.l[2]}", {"a": None, "l": [1, None, 3]})
    assert got == [True, 2, 3]


def test_results_encode_as_gopher_json_does() -> None:
    assert run("return {}", {}) == []
    assert run("return {1, 2}", {}) == [1, 2]
    assert run("return {a = {}}", {}) == {"a": []}
    with pytest.raises(LuaScriptError, match="mixed or invalid key"):
        run("return {[true] = 1}", {})
    with pytest.raises(LuaScriptError, match="expect table output"):
        run("return 'Healthy'", {})


def test_a_health_status_outside_argo_cds_set_is_unknown() -> None:
    scripts = Scripts(health="return {status = 'Fine', message = 'x'}", discovery="return {}", actions={})
    assert health({}, scripts) == Health("Unknown", "Lua returned an invalid health status")


def test_an_empty_discovery_offers_nothing_and_an_empty_entry_is_an_enabled_action() -> None:
    assert discover({}, Scripts(health="", discovery="return {}", actions={})) == {}
    got = discover({}, Scripts(health="", discovery="return {go = {}}", actions={}))
    assert [(a.name, a.disabled) for a in got.values()] == [("go", False)]


def test_empty_maps_come_back_as_maps_even_one_the_action_emptied() -> None:
    """argo-cd's cleanReturnedObj puts the live map back wherever the script returned ``[]``: an
    action cannot empty a map (the Stack actions only add an annotation)."""
    scripts = Scripts(
        health="", discovery="", actions={"x": "obj.spec.gone = nil\nobj.keep = {}\nreturn obj"}
    )
    new = run_action("x", {"spec": {"gone": 1, "config": {}}, "keep": {"a": 1}, "l": [{"m": {}}]}, scripts)
    assert new == {"spec": {"config": {}}, "keep": {"a": 1}, "l": [{"m": {}}]}


@pytest.mark.parametrize("chunk", ["local x = 7 // 2", "goto done ::done::", "local x = 6 & 3"])
def test_syntax_newer_than_lua_5_1_is_refused_as_gopher_lua_refuses_it(chunk: str) -> None:
    with pytest.raises(LuaScriptError):
        run(f"{chunk}\nreturn {{}}", {})
