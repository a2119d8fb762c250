"""Where vime eval's tasks come from when the env is wrapped (--max-turns)."""

from __future__ import annotations

import vime
from vime.eval.tasks import resolve_tasks


def test_a_wrapped_env_still_gives_its_own_tasks():
    env = vime.make("vime/RepoFix-v0", split="eval", sandbox="local", max_turns=4)
    rows = resolve_tasks(env, path=None, num_tasks=4, seed=0)
    assert [r["id"] for r in rows] == [t["id"] for t in env.unwrapped.generate_tasks(4, seed=0)]
    assert len({r["id"] for r in rows}) == 4
    env.close()
