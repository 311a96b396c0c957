"""CPU profiles (issue 17 part 6): a replica without GPUs draws its cores × the watts per core
of the node's CPU model (decider/placement/estimate.py), as the facility file gives them per
model (`cpu_watts_per_core`, decider/facility.py) and the node's exporter names the model
(`llmgw_node_cpu_info`, read as the snapshot's `cpus` part: decider/prometheus_parse.py).
The default stands where the model is unknown or has no figure."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from decider.facility import Facility
from decider.models import Replica
from decider.placement.estimate import estimate
from decider.prometheus_parse import Dropped, Sample, parse_part
from tests.facility_helpers import load, refusal
from tests.placement_helpers import NOW, Site, assert_as_decide, make_snapshot

EPYC = "AMD EPYC 9654 96-Core Processor"
GRACE = "ARM Neoverse-V2"
FACILITY = f"""\
mode: enforce
profiles:
  embedder-cpu: {{gpus: 0, cpu_cores: 16}}
  tp1: {{gpus: 1}}
cpu_watts_per_core:
  default: 6
  "{EPYC}": 3.7
  {GRACE}: 3.5
"""


@pytest.fixture
def facility(tmp_path):
    return load(tmp_path, FACILITY)


def node(
    gpus: int | None = 8, limit: float | None = 700.0, cpu_models: tuple[str, ...] = ()
) -> SimpleNamespace:
    """What the estimate reads of a node state: its GPUs, their enforced limit, its CPU
    models."""
    return SimpleNamespace(gpus=gpus, gpu_limit_watts=limit, cpu_models=cpu_models)


def cpu_replica(cores: float | None = None) -> Replica:
    return Replica(model="embedder", profile="embedder-cpu", gpus=0, cpu_cores=cores)


# --- the facility file ----------------------------------------------------------------------


def test_the_file_gives_a_figure_per_model_beside_the_default(facility):
    per_core = facility.cpu_watts_per_core
    assert per_core.default == 6
    assert per_core.models == {EPYC: 3.7, GRACE: 3.5}
    assert per_core.for_models([EPYC]) == (3.7, EPYC)
    assert per_core.for_models(["Intel(R) Xeon(R) Platinum 8480+"]) == (6, None)
    assert per_core.for_models([]) == (6, None)


def test_a_model_is_matched_with_whitespace_runs_as_one_space(tmp_path):
    facility = load(
        tmp_path, 'mode: observe\ncpu_watts_per_core: {"AMD EPYC  9654 96-Core  Processor": 4}\n'
    )
    assert facility.cpu_watts_per_core.models == {EPYC: 4}
    assert facility.cpu_watts_per_core.default == 6  # kept when the file gives models only


def test_a_bare_number_is_still_the_default(tmp_path):
    facility = load(tmp_path, "mode: observe\ncpu_watts_per_core: 8\n")
    assert (facility.cpu_watts_per_core.default, facility.cpu_watts_per_core.models) == (8, {})


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        (
            f'"{EPYC}": 370',
            f"facility.yaml:3: cpu_watts_per_core.{EPYC}: Input should be less than or equal"
            " to 100",
        ),
        (
            f'"{EPYC}": "3.7"',
            f"facility.yaml:3: cpu_watts_per_core.{EPYC}: Input should be a valid number",
        ),
        (
            f'"{EPYC}": 0',
            f"facility.yaml:3: cpu_watts_per_core.{EPYC}: Input should be greater than 0",
        ),
        ('"": 3', "'' is not a CPU model"),
        ("7: 3", "7 is not a CPU model"),
        (
            f'"{EPYC}": 3.7\n  "AMD EPYC 9654  96-Core Processor": 3.9',
            f"CPU model '{EPYC}' is given twice",
        ),
    ],
)
def test_a_bad_figure_or_model_is_refused_with_its_line(tmp_path, entry, words):
    text = f"mode: observe\ncpu_watts_per_core:\n  {entry}\n"
    assert words in refusal(tmp_path, text)


# --- the estimate ---------------------------------------------------------------------------


def test_a_cpu_replica_takes_its_nodes_model_figure(facility):
    guess = estimate(cpu_replica(), node(), facility, 700.0, cpu_models=(EPYC,))
    assert (guess.watts, guess.basis, guess.gaps) == (pytest.approx(16 * 3.7), "derived", ())
    on_grace = estimate(cpu_replica(8), node(), facility, 700.0, cpu_models=[GRACE])
    assert on_grace.watts == pytest.approx(8 * 3.5)  # the request's cores over the profile's


def test_the_default_stands_for_an_unknown_model_or_one_without_a_figure(facility):
    for models in ((), ("Intel(R) Xeon(R) Platinum 8480+",)):
        assert estimate(cpu_replica(), node(), facility, 700.0, cpu_models=models).watts == 16 * 6
    assert estimate(cpu_replica(), node(), facility, 700.0).watts == 16 * 6  # not given


def test_the_node_states_models_are_read_unless_given(facility):
    assert estimate(cpu_replica(), node(cpu_models=(EPYC,)), facility, 700.0).watts == (
        pytest.approx(16 * 3.7)
    )
    given = estimate(cpu_replica(), node(cpu_models=(EPYC,)), facility, 700.0, cpu_models=())
    assert given.watts == 16 * 6


def test_a_node_of_two_models_takes_the_larger_figure(facility):
    guess = estimate(cpu_replica(), node(), facility, 700.0, cpu_models=(GRACE, EPYC))
    assert guess.watts == pytest.approx(16 * 3.7)


def test_a_gpu_replica_or_a_declared_draw_ignores_the_cpu_model(facility):
    gpu = Replica(model="m", profile="tp1", gpus=1)
    plain = estimate(gpu, node(), facility, 700.0)
    assert estimate(gpu, node(), facility, 700.0, cpu_models=(EPYC,)) == plain
    declared = Replica(model="m", profile="embedder-cpu", gpus=0, power_watts=90.0)
    assert estimate(declared, node(), facility, 700.0, cpu_models=(EPYC,)).watts == 90.0


# --- the snapshot's `cpus` part -------------------------------------------------------------


def test_the_cpus_part_reads_each_nodes_models_and_leaves_a_bad_series_out():
    dropped = Dropped()
    samples = [
        Sample({"node": "n1", "model": EPYC}, 1.0),
        Sample({"node": "n2", "model": GRACE}, 1.0),
        Sample({"node": "n2", "model": EPYC}, 1.0),
        Sample({"node": "n3"}, 1.0),  # no model
        Sample({"model": GRACE}, 1.0),  # no node
    ]
    assert parse_part("cpus", samples, dropped) == {"n1": (EPYC,), "n2": (EPYC, GRACE)}
    assert dropped.count == 2
    note = dropped.message() or ""
    assert 'node="n3"' in note and "no `model` label" in note and "no `node` label" in note


# --- placement: each node's own model ------------------------------------------------------

#: Three nodes in one rack whose limit is 90 W (cap 100 W, margin 10 %): a 16-core replica
#: fits on the EPYC node (59.2 W) and not on the others (96 W at the default).
MODELS = {"n1": (EPYC,), "n2": ("Intel(R) Xeon(R) Platinum 8480+",), "n3": ()}


def cpu_site(tmp_path, facility: Facility, read_at: float | None = NOW) -> Site:
    snapshot = make_snapshot(
        {name: ["rack/r1"] for name in MODELS},
        gpus=dict.fromkeys(MODELS, 0),
        read_at={"cpus": read_at},
    )
    snapshot = dataclasses.replace(snapshot, cpu_models={n: m for n, m in MODELS.items() if m})
    return Site(tmp_path / "db.sqlite", facility, snapshot, (), {})


def small_rack(tmp_path, facility: Facility) -> Facility:
    return facility.model_copy(
        update={
            "domains": load(
                tmp_path, "mode: enforce\ndomains: {rack/r1: {cap_watts: 100}}\n"
            ).domains
        }
    )


def test_placement_estimates_each_node_at_its_own_models_figure(tmp_path, facility):
    site = cpu_site(tmp_path, small_rack(tmp_path, facility))
    answer = site.answer(cpu_replica(), list(MODELS))
    estimates = {n["node"]: n["estimate_watts"] for n in answer["nodes"]}
    assert estimates == {"n1": pytest.approx(16 * 3.7), "n2": 16 * 6, "n3": 16 * 6}
    assert answer["order"] == ["n1"]  # the others are past the rack's 90 W
    # the answer cache (one estimate per hardware kind) agrees: the model is part of the kind
    assert_as_decide(site.view(), cpu_replica(), list(MODELS))


def test_a_stale_cpus_part_leaves_every_node_at_the_default(tmp_path, facility):
    site = cpu_site(tmp_path, small_rack(tmp_path, facility), read_at=NOW - 4_000)
    answer = site.answer(cpu_replica(), list(MODELS))
    assert {n["estimate_watts"] for n in answer["nodes"]} == {16 * 6}
    assert answer["order"] == []
    assert any(line.startswith("each node's CPU models") for line in answer["missing"])
