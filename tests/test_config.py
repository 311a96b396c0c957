"""agent.yaml: accepted as documented, refused with file, line and reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from exporter import config as agent_config
from llmgw_common.yamlfile import MAX_ALIASES, ConfigError, load_text, parse_duration

EXAMPLE = Path(__file__).parent.parent / "examples" / "agent.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        agent_config.load(write(tmp_path, text))
    return str(caught.value)


def test_the_example_file_loads_as_documented():
    config = agent_config.load(EXAMPLE)
    assert config.node == "gpu-r12-07-03"
    assert (config.labels.site, config.labels.room, config.labels.row, config.labels.rack) == (
        "sto1",
        "hall-b",
        "12",
        "r12-07",
    )
    assert config.labels.pdus == ["r12-07-a", "r12-07-b"]
    assert config.overhead_watts == 250
    assert config.listen_address == ("0.0.0.0", 9850)
    assert config.interval("rapl") == 5.0


def test_no_file_means_defaults_named_after_the_host():
    config = agent_config.load(None)
    assert config.node
    assert config.labels.pdus == []
    assert config.overhead_watts is None
    assert all(config.source(name).enabled for name in ("gpu", "hwmon", "rapl"))


def test_a_numeric_row_is_a_name(tmp_path):
    config = agent_config.load(write(tmp_path, "labels: {llmgw.io/row: 12}\n"))
    assert config.labels.row == "12"


def test_every_problem_is_reported_at_once_with_its_line(tmp_path):
    message = refusal(
        tmp_path,
        (
            "node: n1\n"
            "labels:\n"
            "  llmgw.io/rak: r1\n"  # line 3: a typo of rack
            "overhead_watts: -5\n"  # line 4: negative
            "sources:\n"
            "  gpu: {interval: 5 parsecs}\n"  # line 6: not a duration
            "  gpus: {enabled: false}\n"  # line 7: no such source
        ),
    )
    path = tmp_path / "agent.yaml"
    assert f"{path}:3: labels.llmgw.io/rak: Extra inputs are not permitted" in message
    assert f"{path}:4: overhead_watts: Input should be greater than or equal to 0" in message
    assert f"{path}:6: sources.gpu.interval: Value error, '5 parsecs' is not a duration" in message
    assert f"{path}:7: sources.gpus: Extra inputs are not permitted" in message


def test_a_rapl_interval_that_would_miss_a_wrap_is_refused(tmp_path):
    message = refusal(tmp_path, "sources:\n  rapl:\n    interval: 30m\n")
    assert ":3: sources.rapl.interval: Value error, 1800s is longer than" in message


def test_broken_yaml_names_its_line(tmp_path):
    message = refusal(tmp_path, "node: n1\nlabels: [unclosed\n")
    assert message.startswith(f"{tmp_path / 'agent.yaml'}:")
    assert "not valid YAML" in message


def test_duplicate_keys_are_refused_not_silently_overwritten(tmp_path):
    message = refusal(tmp_path, "node: a\nnode: b\n")
    assert ":2: duplicate key 'node'" in message


def test_a_bad_listen_address_is_refused(tmp_path):
    assert "listen: Value error, 'localhost' is not HOST:PORT" in refusal(
        tmp_path, "listen: localhost\n"
    )


def test_an_unreadable_file_is_a_clear_refusal(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the file"):
        agent_config.load(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), (3, 3.0), ("1.5s", 1.5)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0s", "-1s", "soon", True, "5 s s"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_check_config_passes_a_good_file_and_names_every_problem_of_a_bad_one(tmp_path, capsys):
    from llmgw_facility.cli import main

    assert main(["check-config", "--agent", str(EXAMPLE)]) == 0
    assert "examples/agent.yaml: ok (node gpu-r12-07-03, rack r12-07)" in capsys.readouterr().out
    bad = write(tmp_path, "labels: {llmgw.io/rack: r1, llmgw.io/pud: p}\noverhead_watts: lots\n")
    assert main(["check-config", "--agent", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:1: labels.llmgw.io/pud: Extra inputs are not permitted" in err
    assert f"{bad}:2: overhead_watts: Input should be a valid number" in err


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        (":9850", ("0.0.0.0", 9850)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:9850", ("::1", 9850)),
    ],
)
def test_listen_addresses(tmp_path, listen, address):
    assert agent_config.load(write(tmp_path, f"listen: '{listen}'\n")).listen_address == address


def test_a_listen_without_a_port_separator_is_refused(tmp_path):
    assert "is not HOST:PORT" in refusal(tmp_path, "listen: '9850'\n")


def test_an_interval_too_short_to_mean_anything_is_refused(tmp_path):
    assert ":2: sources.gpu.interval: Value error, 0.001s is shorter than 0.1s" in refusal(
        tmp_path, "sources:\n  gpu: {interval: 1ms}\n"
    )


# --- what the YAML loader takes (llmgw_common.yamlfile, every config file) ------------------


def test_aliases_within_the_bounds_are_read(tmp_path):
    config = agent_config.load(write(tmp_path, "node: &w n1\nlabels:\n  llmgw.io/rack: *w\n"))
    assert config.labels.rack == "n1"
    # 100 aliases are within the bounds: the file is read, refused for the unknown key alone.
    aliases = "".join(f"  n{i}: *w\n" for i in range(MAX_ALIASES))
    assert refusal(tmp_path, f"node: &w n1\nx:\n{aliases}").endswith(
        ":3: x: Extra inputs are not permitted"
    )


def test_one_alias_past_the_bound_is_refused_at_its_line(tmp_path):
    aliases = "".join("  - *w\n" for _ in range(MAX_ALIASES + 1))
    message = refusal(tmp_path, f"node: &w n1\nx:\n{aliases}")
    assert message.endswith(f":{3 + MAX_ALIASES}: not valid YAML: more than 100 aliases")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a: &b {c: 1}\nd:\n  <<: *b\n", ":3: a merge key (<<) is not supported"),
        ("node: 2024-01-01\n", ":1: '2024-01-01' reads as a date, which no setting takes"),
        ("? [a, b]\n: c\n", ":1: a key must be a plain value, not a list or mapping"),
        ("node: !!int n1\n", ":1: 'n1' cannot be read as tag:yaml.org,2002:int"),
        ("overhead_watts: .nan\n", ":1: .nan is not a finite number"),
        ("overhead_watts: -1.0e+16\n", ":1: -1.0e+16 is larger than any figure"),
    ],
    ids=["merge key", "date", "complex key", "bad tag", "nan", "huge"],
)
def test_values_no_setting_takes_are_refused_with_their_line(tmp_path, text, problem):
    assert problem in refusal(tmp_path, text)


def test_load_text_keeps_the_bounds():
    assert load_text("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}
    with pytest.raises(yaml.YAMLError, match="a recursive alias"):
        load_text("a: &x [*x]\n")


@pytest.mark.parametrize(
    ("value", "reason"),
    [("8785h", "more than a year"), (float("inf"), "not a finite duration"), ("0s", "zero")],
)
def test_durations_past_a_year_or_not_finite_are_refused(value, reason):
    with pytest.raises(ValueError, match=reason):
        parse_duration(value)
