"""A test env whose reward a random tiny model earns about half the time, so RL has signal."""

import vime


class Parity(vime.Env):
    """Reward 1 when the sum of the reply's character codes is even."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        task = (options or {}).get("task") or {"question": "Say something."}
        return [{"role": "user", "content": task["question"]}], {}

    def step(self, action):
        text = self.parse_action(action).get("content") or ""
        reward = float(sum(map(ord, text)) % 2 == 0)
        return [], reward, True, False, {"correct": reward}


vime.register("test/Parity-v0", Parity)
