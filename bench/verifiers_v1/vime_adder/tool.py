"""The ``add`` tool served as a ``verifiers.v1`` toolset (an MCP server of its own)."""

import verifiers.v1 as vf


class AdderToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = ""  # the stub engine's scripted model calls the tool ``add``

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


if __name__ == "__main__":
    AdderToolset.run()
