"""hack/shuffle.py's order: every id once, a module's ids together, the seed repeats it."""

from pko.devtools.shuffle import node_ids, shuffled

COLLECTED = """test/a.py::test_one
test/a.py::test_two[x y]
test/b.py::Group::test_three
test/a.py::test_four
test/b.py::test_five

5 tests collected in 0.10s
"""


def test_node_ids_are_the_lines_before_the_summary() -> None:
    assert node_ids(COLLECTED) == [
        "test/a.py::test_one",
        "test/a.py::test_two[x y]",
        "test/b.py::Group::test_three",
        "test/a.py::test_four",
        "test/b.py::test_five",
    ]


def test_a_shuffle_keeps_each_module_together_and_repeats_with_its_seed() -> None:
    ids = [f"test/m{m}.py::test_{t}" for m in range(4) for t in range(6)]
    orders = {tuple(shuffled(ids, seed)) for seed in range(20)}
    assert len(orders) > 1
    for order in orders:
        assert sorted(order) == sorted(ids)
        modules = [node.split("::")[0] for node in order]
        runs = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
        assert len(runs) == len(set(runs)) == 4, order
    assert shuffled(ids, 3) == shuffled(ids, 3)
