"""Tools pickle and copy like the functions they wrap, so envs holding them can cross processes."""

import copy
import pickle

from vime.envs.tools import Tool, tool


@tool
def shout(text: str) -> str:
    """Upper-case text."""
    return text.upper()


def whisper(text: str) -> str:
    """Lower-case text."""
    return text.lower()


class Notebook:
    def __init__(self) -> None:
        self.pages: list[str] = []
        self.extra = tool(whisper, name="quiet", timeout=3)

    @tool
    def write(self, page: str) -> int:
        """Add a page."""
        self.pages.append(page)
        return len(self.pages)

    def _erase(self) -> int:
        """Remove every page."""
        self.pages.clear()
        return 0

    erase = tool(_erase, name="erase")


def test_module_level_tool_pickles_by_reference():
    assert pickle.loads(pickle.dumps(shout)) is shout


def test_instance_with_bound_and_attribute_tools_round_trips():
    book = Notebook()
    book.write("one")
    clone = pickle.loads(pickle.dumps(book))
    assert clone.pages == ["one"]
    assert clone.write("two") == 2 and book.pages == ["one"]
    assert (clone.extra.name, clone.extra.timeout, clone.extra("HEY")) == ("quiet", 3, "hey")


def test_a_pickled_bound_tool_stays_bound_to_a_copy_of_its_instance():
    book = Notebook()
    bound = pickle.loads(pickle.dumps(book.write))
    assert isinstance(bound, Tool)
    assert bound("p") == 1 and book.pages == []


def test_deepcopy_binds_tools_to_the_copy():
    book = Notebook()
    book.saved = book.write  # a bound tool stored on its own instance
    clone = copy.deepcopy(book)
    clone.saved("x")
    assert (clone.pages, book.pages) == (["x"], [])


def test_binding_never_changes_the_class_level_tool():
    Notebook().write("a")
    assert Notebook.__dict__["write"]._instance is None


def test_a_tool_stored_under_another_attribute_name_pickles_as_that_attribute():
    book = Notebook()
    book.write("a")
    bound = pickle.loads(pickle.dumps(book.erase))
    assert isinstance(bound, Tool) and bound.name == "erase"
    assert bound() == 0 and book.pages == ["a"]
