"""decider/placement/_entry_index.c against its Python stand-in, the loop it replaced.

`EntryIndex.join` in C must give what `EntryIndexInPython.join` gives (decider.placement.
entry_index): the nodes' bytes, the order, the refused entries, or the first candidate with
no entry. tests/test_placement_answers.py holds whole answers to `decide`'s through each of
the two; these hold the C loop to the Python one, its rounds of fetching ahead and bad input
included.
"""

from __future__ import annotations

import gc
import sys
import weakref
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decider.placement import entry_index
from decider.placement._entry_index import EntryIndex
from decider.placement.entry_index import EntryIndexInPython


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Entry:  # what EntryIndex reads of answers.Entry
    name: str
    head: bytes
    rank: float | None


def test_the_c_loop_is_built() -> None:
    # `make` installs gcc and python3-dev first; without them the package installs without
    # it and every placement runs the Python loop (setup.py), which CI must not hide.
    assert entry_index.COMPILED, "decider/placement/_entry_index.c is not built: pip install -e ."
    assert entry_index.EntryIndex is EntryIndex


def entry(name: str, rank: float | None) -> Entry:
    scores = b"" if rank is None else b',"scores":{"scheduler_order":'
    return Entry(name, b',{"node":"' + name.encode() + b'"' + scores, rank)


def site(count: int) -> dict[str, Entry]:
    return {
        f"n{i:05d}": entry(f"n{i:05d}", None if i % 5 == 0 else float(i % 7)) for i in range(count)
    }


def assert_joined_alike(
    base: dict[str, Entry], over: dict[str, Entry | None], candidates: list[str]
) -> None:
    got = EntryIndex(base).join(over, candidates)
    want = EntryIndexInPython(base).join(over, candidates)
    if isinstance(want, int):
        assert got == want
        return
    assert isinstance(got, tuple)
    nodes, order, refused = got
    assert nodes == want[0]
    assert order == want[1]
    assert len(refused) == len(want[2])
    assert all(a is b for a, b in zip(refused, want[2], strict=True))


names = st.sampled_from([f"n{i}" for i in range(40)] + ["ü-node", "节点-1", "n\U0001f600"])


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(names, st.one_of(st.none(), st.integers(-3, 3).map(float)), max_size=30),
    st.dictionaries(names, st.one_of(st.none(), st.integers(-3, 3).map(float)), max_size=10),
    st.booleans(),
    st.lists(names, unique=True, max_size=40),
)
def test_join_is_the_python_loops(
    ranks: dict[str, float | None],
    over_ranks: dict[str, float | None],
    stale_some: bool,
    candidates: list[str],
) -> None:
    base = {name: entry(name, rank) for name, rank in ranks.items()}
    over: dict[str, Entry | None] = {
        name: (None if stale_some and rank is None else entry(name, rank))
        for name, rank in over_ranks.items()
    }
    assert_joined_alike(base, over, candidates)


@pytest.mark.parametrize("count", [0, 1, 255, 256, 257, 1_000, 12_345])
def test_join_spans_its_rounds_of_fetching_ahead(count: int) -> None:
    # 256 candidates a round (AHEAD); indexes of one to five digits.
    base = site(max(count, 1))
    candidates = list(reversed(base))[:count]
    assert_joined_alike(base, {}, candidates)
    over: dict[str, Entry | None] = {name: entry(name, 1.5) for name in candidates[::3]}
    assert_joined_alike(base, over, candidates)


def test_the_first_candidate_without_an_entry_is_named() -> None:
    base = site(600)
    candidates = list(base)
    assert EntryIndex(base).join({}, [*candidates[:300], "elsewhere", *candidates[300:]]) == 300
    assert EntryIndex(base).join({candidates[400]: None}, candidates) == 400  # stale: redo
    assert EntryIndex({}).join({}, ["n00001"]) == 0


def test_equal_ranks_keep_the_schedulers_order() -> None:
    base = {name: entry(name, 2.0) for name in ("c", "a", "b")}
    base["z"] = entry("z", 1.0)
    _, order, _ = EntryIndex(base).join({}, ["c", "a", "z", "b"])
    assert order == ["z", "c", "a", "b"]


def test_the_index_holds_its_entries_until_it_goes() -> None:
    base = site(50)
    held = weakref.ref(base["n00007"])
    before = sys.getrefcount(base["n00007"])
    index = EntryIndex(base)
    after = sys.getrefcount(base["n00007"])  # not in the assert: pytest's rewrite holds one
    assert len(index) == 50
    assert after == before + 1
    base.clear()
    gc.collect()
    nodes, _, refused = index.join({}, ["n00007", "n00010"])  # n00010 refused (rank None)
    assert nodes.startswith(b'{"node":"n00007"') and [e.name for e in refused] == ["n00010"]
    del index, refused
    gc.collect()
    assert held() is None


def test_bad_input_is_refused_with_a_reason() -> None:
    base = site(4)
    with pytest.raises(TypeError, match="node names"):
        EntryIndex(base).join({}, ["n00001", 7])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        EntryIndex(base).join([], ["n00001"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        EntryIndex([("n1", base["n00001"])])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n00002"):
        EntryIndex({"n00001": base["n00002"]})
    with pytest.raises(TypeError, match="head is bytes"):
        EntryIndex({"n1": Entry("n1", "not bytes", 1.0)})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rank a float or None"):
        EntryIndex({"n1": Entry("n1", b",{}", 1)})  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        EntryIndex({"n1": object()})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="head is bytes"):
        EntryIndex({}).join({"n1": Entry("n1", "x", 1.0)}, ["n1"])  # type: ignore[arg-type]
