"""Flag conventions: --vllm-*/--router-* forwarding, YAML configs and typed configs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

import pytest

from vime.cli.common import add_command
from vime.cli.main import _unknown_flag_error, main
from vime.config.passthrough import flags_from_mapping, split_forwarded
from vime.config.schema import add_options, build, option
from vime.config.yaml_file import expand_config_flag, yaml_to_argv
from vime.errors import ConfigError


def test_vllm_and_router_flags_are_forwarded_without_their_prefix() -> None:
    fwd = split_forwarded(
        [
            "--vllm-max-model-len",
            "512",
            "--vllm-enforce-eager",
            "--router-policy=round_robin",
            "--tensor-model-parallel-size",
            "2",
        ]
    )
    assert fwd.vllm == ["--max-model-len", "512", "--enforce-eager"]
    assert fwd.router == ["--policy=round_robin"]
    assert fwd.other == ["--tensor-model-parallel-size", "2"]


def test_vimes_own_router_address_flags_are_not_forwarded() -> None:
    fwd = split_forwarded(["--vllm-router-port", "8000"])
    assert fwd.vllm == [] and fwd.other == ["--vllm-router-port", "8000"]


def test_mapping_to_flags_handles_bools_lists_and_none() -> None:
    argv = flags_from_mapping({"enforce_eager": True, "x": False, "y": None, "ids": [1, 2], "n": 3})
    assert argv == ["--enforce-eager", "--ids", "1", "2", "--n", "3"]


def test_yaml_sections_become_prefixed_flags(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "lr: 1.0e-6\nvllm:\n  max-model-len: 1024\nrouter:\n  policy: round_robin\n"
        "megatron:\n  tensor-model-parallel-size: 2\n"
    )
    assert yaml_to_argv(cfg) == [
        "--lr",
        "1e-06",
        "--vllm-max-model-len",
        "1024",
        "--router-policy",
        "round_robin",
        "--tensor-model-parallel-size",
        "2",
    ]


def test_command_line_flags_come_after_the_config_file_so_they_win(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lr: 0.1\n")
    assert expand_config_flag(["--lr", "0.2", "--config", str(cfg)]) == [
        "--lr",
        "0.1",
        "--lr",
        "0.2",
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("- a\n- b\n", "mapping of flag: value"),
        ("a: [\n", "not valid YAML"),
        ("vllm: 3\n", "section 'vllm' must be a mapping"),
    ],
)
def test_bad_config_files_get_clear_errors(tmp_path, content: str, message: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(content)
    with pytest.raises(ConfigError, match=message):
        yaml_to_argv(cfg)


def test_missing_config_file_is_named() -> None:
    with pytest.raises(ConfigError, match="no such file"):
        yaml_to_argv("/nonexistent/x.yaml")


@dataclass
class DemoConfig:
    """A demo component."""

    model: str = option(help="model path")
    lr: float = option(1e-6, "learning rate")
    mode: Literal["sync", "async"] = option("sync", "loop mode")
    colocate: bool = option(False, "share devices")
    ks: list[int] = option([1], "k values")
    max_staleness: int | None = option(None, "staleness bound")

    def __post_init__(self) -> None:
        if self.max_staleness is not None and self.mode == "sync":
            raise ConfigError("--max-staleness needs --mode async")


def _parse(argv: list[str]) -> DemoConfig:
    parser = argparse.ArgumentParser()
    add_options(parser, DemoConfig)
    return build(DemoConfig, parser.parse_args(argv))


def test_typed_config_from_flags_keeps_defaults_and_types() -> None:
    cfg = _parse(["--model", "m", "--ks", "1", "4", "--colocate"])
    assert cfg == DemoConfig(model="m", ks=[1, 4], colocate=True)
    assert isinstance(cfg.lr, float)


def test_contradictory_flags_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="--max-staleness needs --mode async"):
        _parse(["--model", "m", "--max-staleness", "2"])


def test_literal_flags_reject_values_outside_their_choices(capsys) -> None:
    with pytest.raises(SystemExit):
        _parse(["--model", "m", "--mode", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_unknown_flag_error_suggests_the_closest_flag() -> None:
    parser = argparse.ArgumentParser(prog="vime demo")
    add_options(parser, DemoConfig)
    err = _unknown_flag_error(parser, ["--max-stalenes", "3"])
    assert "'--max-stalenes'" in str(err) and "--max-staleness" in str(err)


def test_add_command_loads_its_runner_lazily() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    add_command(sub, "demo", "json:dumps", help="demo")
    args = parser.parse_args(["demo"])
    assert args._accepts == frozenset()
    assert callable(args._run)


def test_vime_without_a_command_prints_help(capsys) -> None:
    assert main([]) == 0
    assert "usage: vime" in capsys.readouterr().out
