"""The indexed store: keys, indexes kept consistent through add/update/delete/replace, threads."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pko.machinery.store import (
    NAMESPACE_INDEX,
    DeletedFinalStateUnknown,
    Indexer,
    IndexFunc,
    ObjectKeyError,
    deletion_handling_key,
    index_by_field,
    index_by_namespace,
    index_by_owner,
    meta_namespace_key,
    split_key,
)


def obj(
    name: str,
    namespace: str | None = "default",
    rv: str = "1",
    owners: list[dict[str, Any]] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv}
    if namespace:
        meta["namespace"] = namespace
    if owners:
        meta["ownerReferences"] = owners
    return {"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": meta, "spec": spec or {}}


def owner(
    kind: str, name: str, uid: str, controller: bool = False, api_version: str = "pulumi.com/v1"
) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": controller}


OWNER_INDEX, CONTROLLER_INDEX = "owner", "controller"


def indexers() -> dict[str, IndexFunc]:
    """By namespace, by owning Stack and by controlling Stack."""
    return {
        NAMESPACE_INDEX: index_by_namespace,
        OWNER_INDEX: index_by_owner("Stack"),
        CONTROLLER_INDEX: index_by_owner("Stack", controller_only=True),
    }


def test_keys_are_namespace_slash_name_or_name() -> None:
    assert meta_namespace_key(obj("a")) == "default/a"
    assert meta_namespace_key(obj("n1", namespace=None)) == "n1"
    assert split_key("default/a") == ("default", "a")
    assert split_key("n1") == (None, "n1")
    with pytest.raises(ValueError):
        split_key("a/b/c")
    with pytest.raises(ObjectKeyError):
        meta_namespace_key({"metadata": {}})
    tomb = DeletedFinalStateUnknown("ns/x", obj("x", "ns"))
    assert deletion_handling_key(tomb) == "ns/x"


def test_add_update_delete_keep_indexes_consistent() -> None:
    store = Indexer(indexers={**indexers(), "program": index_by_field("spec.programRef.name")})
    program_p1 = {"programRef": {"name": "p1"}}
    a = obj("a", "ns1", owners=[owner("Stack", "s", "uid-s", controller=True)], spec=program_p1)
    b = obj("b", "ns2", owners=[owner("Stack", "s2", "uid-s2")], spec={"programRef": {"name": "p1"}})
    assert store.add(a) is None
    store.add(b)

    assert [o["metadata"]["name"] for o in store.by_index(NAMESPACE_INDEX, "ns1")] == ["a"]
    assert [o["metadata"]["name"] for o in store.by_index("program", "p1")] == ["a", "b"]
    assert store.index_keys(OWNER_INDEX, "ns2/s2") == ["ns2/b"]
    assert store.index_keys(CONTROLLER_INDEX, "ns1/s") == ["ns1/a"]
    assert store.index_keys(CONTROLLER_INDEX, "ns2/s2") == []  # not a controller reference
    assert [o["metadata"]["name"] for o in store.index("program", a)] == ["a", "b"]

    # Moving a to another program removes it from the old index value entirely.
    a2 = obj("a", "ns1", rv="2", spec={"programRef": {"name": "p2"}})
    assert store.update(a2) == a
    assert store.index_keys("program", "p1") == ["ns2/b"]
    assert store.index_keys("program", "p2") == ["ns1/a"]
    assert store.index_keys(CONTROLLER_INDEX, "ns1/s") == []
    assert store.get_by_key("ns1/a") == a2

    assert store.delete(b) == b
    assert store.index_keys("program", "p1") == []
    assert "p1" not in store.list_index_func_values("program")
    assert store.list_keys() == ["ns1/a"]
    assert store.delete(b) is None  # deleting twice is harmless
    assert store.delete(DeletedFinalStateUnknown("ns1/a", a2)) == a2
    assert len(store) == 0
    assert store.list_index_func_values(NAMESPACE_INDEX) == []


def test_replace_reports_adds_changed_updates_and_tombstones() -> None:
    store = Indexer(indexers=indexers())
    keep, change, gone = obj("keep", rv="1"), obj("change", rv="1"), obj("gone", rv="1")
    for o in (keep, change, gone):
        store.add(o)
    keep_same = obj("keep", rv="1")
    change_new = obj("change", rv="5")
    new = obj("new", "other", rv="6")

    result = store.replace([keep_same, change_new, new])

    assert result.added == [new]
    assert result.updated == [(change, change_new)]
    assert result.deleted == [DeletedFinalStateUnknown("default/gone", gone)]
    assert sorted(store.list_keys()) == ["default/change", "default/keep", "other/new"]
    assert store.index_keys(NAMESPACE_INDEX, "default") == ["default/change", "default/keep"]
    assert store.index_keys(NAMESPACE_INDEX, "other") == ["other/new"]


def test_index_function_failure_leaves_store_unchanged() -> None:
    def picky(o: dict[str, Any]) -> list[str]:
        if o["metadata"]["name"] == "bad":
            raise RuntimeError("boom")
        return [o["metadata"]["name"]]

    store = Indexer(indexers={"name": picky})
    store.add(obj("good"))
    with pytest.raises(RuntimeError):
        store.add(obj("bad"))
    with pytest.raises(RuntimeError):
        store.replace([obj("bad")])
    assert store.list_keys() == ["default/good"]
    assert store.index_keys("name", "good") == ["default/good"]


def test_field_index_handles_lists_scalars_missing_and_namespacing() -> None:
    by_tags = index_by_field("spec.tags")
    assert by_tags(obj("a", spec={"tags": ["x", "y", {"nested": 1}]})) == ["x", "y"]
    assert by_tags(obj("a", spec={"tags": True})) == ["true"]
    assert by_tags(obj("a", spec={})) == []
    assert by_tags({"metadata": {"name": "a"}, "spec": "not-a-dict"}) == []
    ns_program = index_by_field("spec.programRef.name", namespaced=True)
    assert ns_program(obj("a", "ns", spec={"programRef": {"name": "p"}})) == ["ns/p"]
    assert index_by_field("spec.x") is index_by_field("spec.x")  # shared informers compare indexers
    with pytest.raises(ValueError):
        index_by_field("spec..x")


def test_owner_kind_index_gives_owner_keys() -> None:
    by_stack = index_by_owner("Stack", api_group="pulumi.com", controller_only=True)
    update = obj(
        "u1",
        "ns",
        owners=[
            owner("Stack", "s1", "uid1", controller=True),
            owner("Stack", "s2", "uid2", controller=False),
            owner("Stack", "s3", "uid3", controller=True, api_version="other.io/v1"),
            owner("Workspace", "w", "uid4", controller=True),
        ],
    )
    assert by_stack(update) == ["ns/s1"]
    assert index_by_owner("Stack")(update) == ["ns/s1", "ns/s2", "ns/s3"]


def test_add_indexers_indexes_existing_objects_and_rejects_duplicates() -> None:
    store = Indexer()
    store.add(obj("a", spec={"programRef": {"name": "p"}}))
    store.add_indexers({"program": index_by_field("spec.programRef.name")})
    assert store.index_keys("program", "p") == ["default/a"]
    with pytest.raises(ValueError):
        store.add_indexers({"program": index_by_field("spec.other")})
    with pytest.raises(KeyError):
        store.by_index("nope", "x")


def test_concurrent_writers_and_readers_keep_indexes_consistent() -> None:
    store = Indexer(indexers={"program": index_by_field("spec.programRef.name")})
    errors: list[BaseException] = []

    def writer(worker: int) -> None:
        try:
            for i in range(300):
                name = f"o{i % 20}"
                store.add(obj(name, spec={"programRef": {"name": f"p{(i + worker) % 3}"}}, rv=str(i)))
                if i % 7 == 0:
                    store.delete(obj(name))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(300):
                for value in store.list_index_func_values("program"):
                    for o in store.by_index("program", value):
                        assert o["spec"]["programRef"]["name"] == value
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)] + [
        threading.Thread(target=reader) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    # Every stored object is indexed under exactly its current value, and nothing else is indexed.
    indexed = {k for v in store.list_index_func_values("program") for k in store.index_keys("program", v)}
    assert indexed == set(store.list_keys())
    for key in store.list_keys():
        current = store.get_by_key(key)
        assert current is not None
        assert store.index_keys("program", current["spec"]["programRef"]["name"]).count(key) == 1


def test_reads_return_fresh_copies_callers_may_change() -> None:
    store = Indexer(indexers={"program": index_by_field("spec.programRef.name")})
    original = obj("a", spec={"programRef": {"name": "p1"}})
    store.add(original)
    original["spec"]["programRef"]["name"] = "changed-after-add"  # the store kept its own copy

    first = store.get_by_key("default/a")
    assert first is not None and first["spec"]["programRef"]["name"] == "p1"
    first["spec"]["programRef"]["name"] = "mutated"
    first["metadata"]["labels"] = {"x": "y"}
    for read in (store.get_by_key("default/a"), store.list()[0], store.by_index("program", "p1")[0]):
        assert read == obj("a", spec={"programRef": {"name": "p1"}})
        assert read is not first
    assert store.index_keys("program", "p1") == ["default/a"]
    assert store.index_keys("program", "mutated") == []


def test_entries_carry_key_resource_version_and_index_values_undecoded() -> None:
    store = Indexer(indexers=indexers())
    a = obj("a", "ns1", rv="7", owners=[owner("Stack", "s", "uid-s", controller=True)])
    entry = store.encode(a)
    assert entry.key == "ns1/a" and entry.resource_version == "7"
    assert dict(entry.index_values) == {
        NAMESPACE_INDEX: ("ns1",),
        OWNER_INDEX: ("ns1/s",),
        CONTROLLER_INDEX: ("ns1/s",),
    }
    assert entry.decode() == a and entry.decode() is not entry.decode()
    assert store.put(entry) is None
    assert store.put(store.encode(obj("a", "ns1", rv="8"))) == entry
    assert store.index_keys(OWNER_INDEX, "ns1/s") == []
    assert store.get_entry("ns1/a") is not None
    removed = store.remove_key("ns1/a")
    assert removed is not None and removed.resource_version == "8"
    assert len(store) == 0 and store.list_index_func_values(NAMESPACE_INDEX) == []
    with pytest.raises(ValueError):
        store.encode({"metadata": {"name": "x"}, "spec": {"not-json": object()}})


def test_entries_encoded_before_an_indexer_was_added_are_indexed_by_it() -> None:
    store = Indexer(indexers={NAMESPACE_INDEX: index_by_namespace})
    early = store.encode(obj("a", spec={"programRef": {"name": "p"}}))
    early_too = store.encode(obj("b", spec={"programRef": {"name": "q"}}))
    store.add_indexers({"program": index_by_field("spec.programRef.name")})
    store.put(early)
    result = store.replace_entries([early, early_too])
    assert [e.key for e in result.added_entries] == ["default/b"]
    assert store.index_keys("program", "p") == ["default/a"]
    assert store.index_keys("program", "q") == ["default/b"]
    store.remove_key("default/a")
    assert store.list_index_func_values("program") == ["q"]
