from __future__ import annotations

from typing import Any

from pko.machinery.recentwrites import RecentWrites, newer
from pko.machinery.store import LAST_APPLIED_ANNOTATION, clone, strip_managed_fields, without_managed_fields

Obj = dict[str, Any]


def obj(rv: str, status: str = "", name: str = "a", namespace: str | None = "ns") -> Obj:
    meta: Obj = {"name": name, "resourceVersion": rv, "managedFields": [{"manager": "pko"}]}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "status": {"phase": status}}


def test_a_write_the_cache_has_not_caught_up_with_is_read_through() -> None:
    recent = RecentWrites()
    written = obj("12", "written")
    assert recent.wrote(written) is written
    latest = recent.latest("ns/a", obj("10", "cached"))
    assert latest is not None and latest["status"] == {"phase": "written"}
    assert "managedFields" not in latest["metadata"]  # shaped as the informers keep objects
    latest["status"]["phase"] = "mutated by a reconcile"
    again = recent.latest("ns/a", obj("10", "cached"))
    assert again is not None and again["status"] == {"phase": "written"}  # a copy each time


def test_the_cache_wins_once_it_has_the_write_and_the_entry_goes() -> None:
    recent = RecentWrites()
    recent.wrote(obj("12", "written"))
    assert recent.latest("ns/a", obj("12", "cached")) == obj("12", "cached")
    # Forgotten: an older cached version read afterwards is not overlaid any more.
    assert recent.latest("ns/a", obj("11", "older")) == obj("11", "older")


def test_a_gone_object_is_forgotten() -> None:
    recent = RecentWrites()
    recent.wrote(obj("12", "written"))
    assert recent.latest("ns/a", None) is None
    assert recent.latest("ns/a", obj("5", "recreated")) == obj("5", "recreated")


def test_caught_up_from_event_handlers() -> None:
    recent = RecentWrites()
    recent.wrote(obj("12", "written", name="b", namespace=None))  # cluster-scoped key: "b"
    recent.caught_up(obj("11", "older", name="b", namespace=None))
    assert recent.latest("b", obj("11"))["status"] == {"phase": "written"}  # type: ignore[index]
    recent.caught_up(obj("13", name="b", namespace=None))
    assert recent.latest("b", obj("11")) == obj("11")
    recent.wrote(obj("20", "written"))
    recent.caught_up(obj("12"), gone=True)
    assert recent.latest("ns/a", obj("12")) == obj("12")


def test_resource_versions_compare_as_numbers_and_otherwise_the_cache_wins() -> None:
    assert newer(obj("100"), obj("99"))
    assert not newer(obj("99"), obj("100"))
    assert not newer(obj("abc"), obj("1"))
    recent = RecentWrites()
    recent.wrote(obj("abc", "written"))
    assert recent.latest("ns/a", obj("1", "cached")) == obj("1", "cached")


def test_a_write_is_kept_as_the_default_transform_shapes_it_and_left_untouched() -> None:
    written = obj("12", "written")
    written["metadata"]["annotations"] = {LAST_APPLIED_ANNOTATION: "{...}", "other": "x"}
    before = clone(written)
    recent = RecentWrites()
    assert recent.wrote(written) is written
    assert written == before  # neither managedFields nor the annotation taken from the caller's object
    latest = recent.latest("ns/a", obj("10", "cached"))
    assert latest == strip_managed_fields(clone(written))
    assert latest is not None and latest["metadata"]["annotations"] == {"other": "x"}
    assert without_managed_fields(written) == strip_managed_fields(clone(written))
    assert without_managed_fields({"metadata": {"name": "b"}}) == {"metadata": {"name": "b"}}
    assert without_managed_fields({"kind": "NoMetadata"}) == {"kind": "NoMetadata"}


def test_a_write_is_kept_as_another_transform_shapes_it() -> None:
    def upper_status(o: Obj) -> Obj:
        o["status"]["phase"] = o["status"]["phase"].upper()
        return o

    written = obj("12", "written")
    recent = RecentWrites(upper_status)
    recent.wrote(written)
    assert written["status"] == {"phase": "written"}
    latest = recent.latest("ns/a", obj("10", "cached"))
    assert latest is not None and latest["status"] == {"phase": "WRITTEN"}
    assert latest["metadata"]["managedFields"] == [{"manager": "pko"}]  # that transform keeps them
