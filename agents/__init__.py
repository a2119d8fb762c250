"""Agent loops (imports as ``vime.agents``): the built-in tool-calling agent, the adapter that
records any ``openai``-client agent, and token-level trajectory assembly."""

from vime.agents.config import AgentConfig
from vime.agents.openai_adapter import RecordingTransport, recording_client, run_openai_agent
from vime.agents.session import ContextLimitReached, LLMSession
from vime.agents.template import ChatTemplateRenderer, TemplateError
from vime.agents.tool_agent import Episode, run
from vime.agents.trajectory import TrajectoryBuilder, training_samples

__all__ = [
    "AgentConfig",
    "ChatTemplateRenderer",
    "ContextLimitReached",
    "Episode",
    "LLMSession",
    "RecordingTransport",
    "TemplateError",
    "TrajectoryBuilder",
    "recording_client",
    "run",
    "run_openai_agent",
    "training_samples",
]
