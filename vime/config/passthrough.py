"""Split a command line into Vime's flags and the flags forwarded to other programs.

``--vllm-X`` flags go to every ``vllm serve`` engine as ``--X``, ``--router-X`` flags go to
vllm-router as ``--X``, and (when the megatron backend is chosen) any other unknown flag is
handed to Megatron's own parser unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

VLLM_PREFIX = "--vllm-"
ROUTER_PREFIX = "--router-"
# Vime's own flags that happen to start with a forwarded prefix.
RESERVED = frozenset({"--vllm-router-ip", "--vllm-router-port"})


def has_flag(args: list[str], flag: str) -> bool:
    """Whether ``args`` holds ``flag`` (as ``--x`` or ``--x=value``)."""
    return any(a == flag or a.startswith(flag + "=") for a in args)


def flag_value(args: list[str], flag: str) -> str | None:
    """The value ``args`` gives ``flag`` (``--x v`` or ``--x=v``; the last one wins, as in
    argparse), or None where it is absent or has no value."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


@dataclass
class ForwardedArgs:
    """Flags that Vime does not interpret, grouped by the program that receives them."""

    vllm: list[str] = field(default_factory=list)
    router: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)


def _groups(tokens: list[str]) -> list[list[str]]:
    """Group ``--flag [values...]`` runs; a stray value before any flag is its own group."""
    groups: list[list[str]] = []
    for tok in tokens:
        if tok.startswith("--") or not groups:
            groups.append([tok])
        else:
            groups[-1].append(tok)
    return groups


def split_forwarded(tokens: list[str]) -> ForwardedArgs:
    """Sort the tokens argparse did not recognise into vLLM, router and other flags.

    ``--vllm-max-model-len 512`` becomes ``--max-model-len 512`` for vLLM;
    ``--router-policy=round_robin`` becomes ``--policy=round_robin`` for the router.
    """
    out = ForwardedArgs()
    for group in _groups(tokens):
        head = group[0]
        name = head.split("=", 1)[0]
        if name.startswith(VLLM_PREFIX) and name not in RESERVED and len(name) > len(VLLM_PREFIX):
            out.vllm += ["--" + head[len(VLLM_PREFIX) :], *group[1:]]
        elif name.startswith(ROUTER_PREFIX) and len(name) > len(ROUTER_PREFIX):
            out.router += ["--" + head[len(ROUTER_PREFIX) :], *group[1:]]
        else:
            out.other += group
    return out


def flags_from_mapping(mapping: dict[str, object], prefix: str = "--") -> list[str]:
    """Turn ``{"max-model-len": 512, "enforce-eager": True}`` into command-line flags.

    ``True`` gives a bare flag, ``False``/``None`` drop it, lists repeat the values, a
    mapping becomes one JSON value.
    """
    argv: list[str] = []
    for key, value in mapping.items():
        flag = prefix + str(key).replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        elif isinstance(value, list | tuple):
            argv += [flag, *[str(v) for v in value]]
        else:
            argv += [flag, str(value)]
    return argv
