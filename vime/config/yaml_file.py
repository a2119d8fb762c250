"""``--config file.yaml``: the same keys as the flags, turned into command-line tokens.

Keys are flag names without the dashes (``max-turns`` or ``max_turns``). The sections
``vllm:``, ``router:`` and ``megatron:`` hold the forwarded flags of those programs.
Flags given on the command line win over the file, because they are parsed after it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vime.config.passthrough import flags_from_mapping
from vime.errors import ConfigError

SECTIONS = {"vllm": "--vllm-", "router": "--router-", "megatron": "--"}


def yaml_to_argv(path: str | Path) -> list[str]:
    """Read a YAML config file and return the equivalent command-line tokens."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        data: Any = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: the top level must be a mapping of flag: value")
    argv: list[str] = []
    for key, value in data.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"--config {path}: section '{key}' must be a mapping")
            argv += flags_from_mapping(value, prefix=SECTIONS[key])
        else:
            argv += flags_from_mapping({key: value})
    return argv


def expand_config_flag(argv: list[str]) -> list[str]:
    """Replace ``--config FILE`` in ``argv`` with the file's flags, placed first."""
    out: list[str] = []
    files: list[str] = []
    it = iter(range(len(argv)))
    for i in it:
        tok = argv[i]
        if tok == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a file path")
            files.append(argv[i + 1])
            next(it, None)
        elif tok.startswith("--config="):
            files.append(tok.split("=", 1)[1])
        else:
            out.append(tok)
    from_files = [t for f in files for t in yaml_to_argv(f)]
    return from_files + out
