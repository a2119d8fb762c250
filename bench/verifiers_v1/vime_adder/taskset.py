"""Tasks that ask the model to count with the ``add`` tool; reward 1 when it answers 4."""

import verifiers.v1 as vf

from vime_adder.tool import AdderToolset

PROMPT = "Count with the add tool, then answer."


class AdderData(vf.TaskData):
    """One task: just the prompt."""


class AdderTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class AdderTask(vf.Task[AdderData, vf.State, AdderTaskConfig]):
    @classmethod
    def toolsets(cls, config: AdderTaskConfig) -> list[vf.Toolset]:
        return [AdderToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def reward(self, trace: vf.Trace) -> float:
        return float("The answer is 4" in str(trace))


class AdderConfig(vf.TasksetConfig):
    num_tasks: int = 8
    task: AdderTaskConfig = AdderTaskConfig()


class AdderTaskset(vf.Taskset[AdderTask, AdderConfig]):
    def load(self) -> list[AdderTask]:
        return [
            AdderTask(AdderData(prompt=PROMPT), self.config.task)
            for _ in range(self.config.num_tasks)
        ]
