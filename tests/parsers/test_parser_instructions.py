"""instructions(): a system-prompt section that teaches a model without a tool-aware chat
template the tools and this family's call format."""

import enum
import json

import pytest

from vime.envs.tools import tool
from vime.tool_parsers import get_parser


class Unit(enum.Enum):
    CELSIUS = "celsius"
    KELVIN = "kelvin"


@tool
def weather(city: str, days: int, unit: Unit, ratio: float | None, detail: bool = False) -> str:
    """Forecast the weather."""
    return city


@tool
def clock() -> str:
    """The time."""
    return "noon"


@pytest.mark.parametrize("family", ["hermes", "llama3", "xml"])
def test_instructions_list_every_schema_and_an_example_that_parses_and_validates(family):
    parser = get_parser(family)
    text = parser.instructions([weather, clock.schema])
    listing = text[text.index("<tools>\n") + 8 : text.index("\n</tools>")].splitlines()
    assert [json.loads(line) for line in listing] == [weather.schema, clock.schema]
    example = text.split("(example values shown):\n")[1].split("\n\n")[0]
    (call,) = parser.parse(example, tools=[weather]).calls
    assert (call.name, call.status) == ("weather", "ok")
    assert weather.validate(call.arguments) == {
        "city": "...",
        "days": 1,
        "unit": Unit.CELSIUS,
        "ratio": 1.5,
    }


def test_llama3_instructions_say_how_to_separate_calls():
    assert "separate them with '; '" in get_parser("llama3").instructions([clock])
    assert "several calls in one reply" in get_parser("hermes").instructions([clock])


def test_no_tools_means_no_instructions():
    assert get_parser("hermes").instructions([]) == ""
