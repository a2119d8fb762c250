"""Schema generation: a typed, documented function becomes a valid OpenAI function schema."""

import dataclasses
import enum
from typing import Annotated, Literal, NotRequired, Optional, TypedDict

import jsonschema
import pydantic
import pytest

from vime.envs.tools import Tool, tool


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(TypedDict):
    x: int
    y: int
    label: NotRequired[str]


@dataclasses.dataclass
class Corner:
    x: float
    y: float


@dataclasses.dataclass
class Box:
    """An axis-aligned box."""

    lo: Corner
    hi: Corner


class Node(pydantic.BaseModel):
    """A tree node."""

    value: int
    children: list["Node"] = []


def check_valid(t: Tool) -> dict:
    jsonschema.Draft202012Validator.check_schema(t.parameters)
    return t.parameters


def test_google_docstring_gives_description_and_parameter_descriptions():
    @tool
    def search(query: str, limit: int = 5) -> list[str]:
        """Search the index.

        Returns the best matching titles.

        Args:
            query: Words to look for.
            limit: How many results to return.
        """
        return []

    assert search.name == "search"
    assert search.description == "Search the index.\n\nReturns the best matching titles."
    assert search.schema == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the index.\n\nReturns the best matching titles.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Words to look for."},
                    "limit": {
                        "type": "integer",
                        "description": "How many results to return.",
                        "default": 5,
                    },
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }
    check_valid(search)


def test_numpy_and_rest_docstrings_give_parameter_descriptions():
    @tool
    def numpy_style(a: int) -> int:
        """Double a number.

        Parameters
        ----------
        a : int
            The number.
        """
        return 2 * a

    @tool
    def rest_style(a: int) -> int:
        """Double a number.

        :param a: The number.
        """
        return 2 * a

    assert numpy_style.parameters["properties"]["a"]["description"] == "The number."
    assert rest_style.parameters["properties"]["a"]["description"] == "The number."


def test_enums_and_literals_become_enum_schemas_with_defaults_as_values():
    @tool
    def paint(color: Color, mode: Literal["fill", "line"] = "fill", c2: Color = Color.BLUE) -> str:
        """Paint."""
        return ""

    props = check_valid(paint)["properties"]
    assert props["color"] == {"enum": ["red", "blue"], "type": "string"}
    assert props["mode"] == {"enum": ["fill", "line"], "type": "string", "default": "fill"}
    assert props["c2"]["default"] == "blue"


def test_optional_parameters_allow_null_and_are_not_required():
    @tool
    def f(a: Optional[int], b: str | None = None) -> None:  # noqa: UP045 (both spellings)
        """F."""

    schema = check_valid(f)
    assert schema["properties"]["a"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert schema["properties"]["b"] == {
        "anyOf": [{"type": "string"}, {"type": "null"}],
        "default": None,
    }
    assert schema["required"] == ["a"]


def test_nested_typeddict_and_dataclass_are_inlined_without_titles():
    @tool
    def draw(boxes: list[Box], points: list[Point], tags: dict[str, list[int]]) -> None:
        """Draw boxes."""

    schema = check_valid(draw)
    assert "$defs" not in schema
    box = schema["properties"]["boxes"]["items"]
    assert box["type"] == "object"
    assert box["description"] == "An axis-aligned box."
    assert box["properties"]["lo"]["properties"] == {
        "x": {"type": "number"},
        "y": {"type": "number"},
    }
    point = schema["properties"]["points"]["items"]
    assert point["properties"] == {
        "x": {"type": "integer"},
        "y": {"type": "integer"},
        "label": {"type": "string"},
    }
    assert point["required"] == ["x", "y"]
    assert schema["properties"]["tags"] == {
        "type": "object",
        "additionalProperties": {"type": "array", "items": {"type": "integer"}},
    }
    assert "title" not in str(schema)


def test_a_parameter_named_title_is_kept():
    @tool
    def rename(title: str) -> None:
        """Rename the document."""

    assert rename.parameters["properties"] == {"title": {"type": "string"}}


def test_recursive_models_keep_their_definition():
    @tool
    def plant(tree: Node) -> int:
        """Plant a tree."""
        return 0

    schema = check_valid(plant)
    node = schema["$defs"]["Node"]
    assert node["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert schema["properties"]["tree"]["properties"]["value"] == {"type": "integer"}
    jsonschema.validate({"tree": {"value": 1, "children": [{"value": 2}]}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tree": {"value": 1, "children": [{"value": "x"}]}}, schema)


def test_annotated_field_constraints_appear_in_the_schema():
    @tool
    def roll(sides: Annotated[int, pydantic.Field(ge=2, le=100, description="Faces.")]) -> int:
        """Roll a die."""
        return 1

    assert roll.parameters["properties"]["sides"] == {
        "type": "integer",
        "minimum": 2,
        "maximum": 100,
        "description": "Faces.",
    }


def test_decorator_options_override_name_description_and_set_timeout():
    @tool(name="lookup", description="Find a word.", timeout=2.5)
    def f(word: str) -> str:
        """Ignored docstring."""
        return word

    assert (f.name, f.description, f.timeout) == ("lookup", "Find a word.", 2.5)
    assert f("hi") == "hi"  # still callable like the function


def test_method_schema_omits_self_and_binds_to_the_instance():
    class Counter:
        def __init__(self) -> None:
            self.total = 0

        @tool
        def add(self, n: int) -> int:
            """Add n to the total."""
            self.total += n
            return self.total

    c = Counter()
    assert list(c.add.parameters["properties"]) == ["n"]
    assert Counter.add.parameters == c.add.parameters
    assert c.add(3) == 3 and c.total == 3


def test_no_parameters_gives_an_empty_object_schema():
    @tool
    def now() -> str:
        """The time."""
        return "noon"

    assert check_valid(now) == {"type": "object", "properties": {}, "additionalProperties": False}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x: int):\n    return x\n", "has no docstring"),
        ("def f(x):\n    'Doc.'\n", "parameter 'x' has no type annotation"),
        ("def f(*xs: int):\n    'Doc.'\n", "*args/**kwargs"),
        ("def f(**kw: int):\n    'Doc.'\n", "*args/**kwargs"),
        ("def f(cb: typing.Callable[[], int]):\n    'Doc.'\n", "parameter 'cb'"),
    ],
)
def test_functions_that_cannot_be_described_are_rejected_with_the_reason(source, message):
    namespace: dict = {"typing": __import__("typing")}
    exec(source, namespace)
    with pytest.raises((TypeError, ValueError), match=message.replace("*", r"\*")):
        tool(namespace["f"])


def test_invalid_names_and_timeouts_are_rejected():
    def f() -> None:
        """Doc."""

    with pytest.raises(ValueError, match="tool name 'has space' is invalid"):
        tool(f, name="has space")
    with pytest.raises(ValueError, match="timeout must be positive"):
        tool(f, timeout=0)


def test_returns_section_is_part_of_the_description():
    @tool
    def count(text: str) -> int:
        """Count words.

        Args:
            text: Any text.

        Returns:
            The number of whitespace-separated words.
        """
        return len(text.split())

    assert count.description == "Count words.\n\nReturns: The number of whitespace-separated words."


def test_annotated_strings_describe_parameters_before_the_docstring():
    @tool
    def move(dx: Annotated[int, "Steps to the right."], dy: int = 0) -> None:
        """Move the cursor.

        Args:
            dx: Overridden by the annotation.
            dy: Steps down.
        """

    props = move.parameters["properties"]
    assert props["dx"] == {"type": "integer", "description": "Steps to the right."}
    assert props["dy"]["description"] == "Steps down."
