"""Argument validation: model-supplied JSON is checked and converted before a tool runs."""

import dataclasses
import enum
from typing import Literal

import pytest

from vime.envs.tools import ToolArgumentError, tool


class Unit(enum.Enum):
    CELSIUS = "celsius"
    KELVIN = "kelvin"


@dataclasses.dataclass
class Place:
    city: str
    country: str = "FR"


@tool
def weather(place: Place, unit: Unit = Unit.CELSIUS, days: int = 1) -> str:
    """Forecast the weather.

    Args:
        place: Where.
        unit: Temperature unit.
        days: How many days ahead.
    """
    return f"{place.city},{place.country},{unit.value},{days}"


@tool
def scale(x: float, mode: Literal["up", "down"], flags: list[bool] | None = None) -> float:
    """Scale a number."""
    return x


def problems(t, arguments) -> list[str]:
    with pytest.raises(ToolArgumentError) as info:
        t.validate(arguments)
    return info.value.problems


def test_valid_arguments_are_converted_to_the_annotated_types():
    values = weather.validate({"place": {"city": "Lyon"}, "unit": "kelvin"})
    assert values == {"place": Place("Lyon", "FR"), "unit": Unit.KELVIN}


def test_safe_coercions_are_applied():
    assert weather.validate({"place": {"city": "Nice"}, "days": "3"})["days"] == 3
    assert weather.validate({"place": {"city": "Nice"}, "days": 2.0})["days"] == 2
    assert scale.validate({"x": 2, "mode": "up"})["x"] == 2.0


def test_wrong_types_are_reported_with_the_offending_value():
    assert problems(weather, {"place": {"city": "Nice"}, "days": "many"}) == [
        "argument 'days': Input should be a valid integer, unable to parse string as an "
        'integer (got "many")'
    ]
    assert problems(weather, {"place": {"city": "Nice"}, "days": 2.5}) == [
        "argument 'days': Input should be a valid integer, got a number with a fractional "
        "part (got 2.5)"
    ]


def test_booleans_are_never_taken_as_numbers():
    assert problems(weather, {"place": {"city": "Nice"}, "days": True}) == [
        "argument 'days': expected a number, got true"
    ]


def test_bad_enum_and_literal_values_list_the_allowed_ones():
    assert problems(weather, {"place": {"city": "Nice"}, "unit": "fahrenheit"}) == [
        "argument 'unit': Input should be 'celsius' or 'kelvin' (got \"fahrenheit\")"
    ]
    assert problems(scale, {"x": 1, "mode": "sideways"}) == [
        "argument 'mode': Input should be 'up' or 'down' (got \"sideways\")"
    ]


def test_nested_errors_name_the_path():
    assert problems(weather, {"place": {"country": "DE"}}) == [
        "argument 'place.city': Field required"
    ]
    assert problems(scale, {"x": 1, "mode": "up", "flags": [True, "maybe"]}) == [
        "argument 'flags[1]': Input should be a valid boolean, unable to interpret input "
        '(got "maybe")'
    ]


def test_missing_and_unknown_arguments_are_all_reported_at_once():
    found = problems(weather, {"palce": {"city": "Nice"}, "days": 1})
    assert found == [
        "unknown argument 'palce'; did you mean 'place'? (expected arguments: place, unit, days)",
        "missing required argument 'place'",
    ]
    err = ToolArgumentError("weather", found)
    assert str(err).startswith("invalid arguments for tool 'weather': unknown argument 'palce'")


@pytest.mark.parametrize("arguments", [None, [1, 2], "place=Nice", 3])
def test_arguments_that_are_not_an_object_are_rejected(arguments):
    (problem,) = problems(weather, arguments)
    assert problem.startswith("arguments must be a JSON object, got ")


def test_validation_error_is_a_value_error():
    with pytest.raises(ValueError, match="missing required argument 'x'"):
        scale.validate({"mode": "up"})
