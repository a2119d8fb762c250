"""Chat spaces: membership and seeded sampling."""

from __future__ import annotations

from vime.envs.spaces import AssistantMessage, ChatMessages


def test_chat_messages_contains_valid_lists_only():
    space = ChatMessages()
    assert space.contains([])
    assert space.contains(
        [
            {"role": "system", "content": "be brief"},
            {"role": "tool", "content": "3", "tool_call_id": "c"},
        ]
    )
    assert not space.contains({"role": "user", "content": "not a list"})
    assert not space.contains([{"role": "robot", "content": "x"}])
    assert not space.contains([{"role": "user", "content": 5}])
    assert not space.contains([{"role": "user", "content": "x", "tool_calls": []}])


def test_assistant_message_contains_text_and_assistant_dicts():
    space = AssistantMessage(tool_names=["add"])
    assert space.contains("plain text")
    call = {"id": "1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    assert space.contains({"role": "assistant", "content": None, "tool_calls": [call]})
    assert not space.contains({"role": "user", "content": "hi"})
    assert not space.contains(
        {"role": "assistant", "content": "x", "tool_calls": [{"function": {}}]}
    )


def test_samples_are_members_and_repeat_with_the_seed():
    for space in (ChatMessages(), AssistantMessage(tool_names=["add", "mul"])):
        space.seed(7)
        first = [space.sample() for _ in range(20)]
        space.seed(7)
        assert [space.sample() for _ in range(20)] == first
        assert all(space.contains(s) for s in first)


def test_assistant_samples_call_the_envs_tools_sometimes():
    space = AssistantMessage(tool_names=["add"], seed=0)
    samples = [space.sample() for _ in range(40)]
    names = {c["function"]["name"] for s in samples for c in s.get("tool_calls", [])}
    assert names == {"add"}
    assert any("tool_calls" not in s for s in samples)
