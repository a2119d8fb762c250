"""register / make on gymnasium's registry, unknown ids, and plugin discovery through the
``vime.envs`` entry-point group (a tiny package installed as a .dist-info on sys.path)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium
import pytest

import vime
from vime.envs import registry
from vime.errors import EnvError

PLUGIN_MODULE = '''
import vime


class Echo(vime.Env):
    """Repeats what the assistant says; ends on "bye"."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": self.greeting}], {}

    def __init__(self, greeting="say something", **kwargs):
        super().__init__(**kwargs)
        self.greeting = greeting

    def step(self, action):
        text = self.parse_action(action)["content"] or ""
        return [{"role": "user", "content": text}], 0.0, text == "bye", False, {}


def register_all():
    vime.register("acme/Echo-v1", Echo, greeting="hello from a callable")


vime.register("acme/Echo-v0", Echo)
'''


@pytest.fixture
def clean_registry():
    before = set(gymnasium.registry)
    yield
    for env_id in set(gymnasium.registry) - before:
        del gymnasium.registry[env_id]


@pytest.fixture
def plugin_path(tmp_path, clean_registry) -> Path:
    """A folder on sys.path holding the acme_envs package's module and .dist-info."""
    (tmp_path / "acme_envs.py").write_text(PLUGIN_MODULE)
    (tmp_path / "acme_broken.py").write_text("raise ImportError('acme_broken needs libfoo')\n")
    info = tmp_path / "acme_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [vime.envs]
            acme = acme_envs
            acme_callable = acme_envs:register_all
            broken = acme_broken
            a_class = acme_envs:Echo
            """
        )
    )
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("acme_envs", "acme_broken"):
        sys.modules.pop(name, None)
    registry.load_plugins(force=True)  # back to the installed plugins only


def test_register_and_make_with_defaults_and_overrides(calc_env_cls, clean_registry):
    vime.register("test/Calc-v0", calc_env_cls, tool_timeout=2.0)
    env = vime.make("test/Calc-v0")
    assert isinstance(env, calc_env_cls) and env.tool_timeout == 2.0
    assert vime.make("test/Calc-v0", tool_timeout=3.0).tool_timeout == 3.0


def test_made_envs_keep_their_async_api(calc_env_cls, clean_registry):
    vime.register("test/Calc-v0", calc_env_cls)
    for env in (vime.make("test/Calc-v0"), gymnasium.make("test/Calc-v0")):
        assert env.unwrapped is env and hasattr(env, "astep")
        assert env.spec.id == "test/Calc-v0"


def test_string_entry_points_import_on_make(clean_registry):
    vime.register("test/Math-v9", "vime.envs.math_env:MathEnv", difficulty="hard")
    env = vime.make("test/Math-v9")
    assert env.difficulty == "hard"


def test_unknown_id_lists_the_closest_registered_ids():
    with pytest.raises(EnvError) as err:
        vime.make("vime/Maths-v0")
    message = str(err.value)
    assert "unknown env id 'vime/Maths-v0'" in message
    assert "Closest registered ids: vime/Math-v0" in message


def test_unknown_id_with_nothing_close_lists_what_exists():
    with pytest.raises(EnvError, match=r"Registered: \[.*'vime/GuessNumber-v0', 'vime/Math-v0'"):
        vime.make("zzzzzzzz")


def test_bad_constructor_arguments_name_the_env_and_the_arguments():
    with pytest.raises(
        EnvError, match=r"cannot make vime/Math-v0 with arguments \{'colour': 'red'\}"
    ):
        vime.make("vime/Math-v0", colour="red")


def test_module_prefix_imports_the_module_that_registers(tmp_path, monkeypatch, clean_registry):
    (tmp_path / "my_envs_mod.py").write_text(PLUGIN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = vime.make("my_envs_mod:acme/Echo-v0")
    assert env.reset()[0] == [{"role": "user", "content": "say something"}]
    sys.modules.pop("my_envs_mod", None)


def test_module_prefix_that_cannot_be_imported_says_so():
    with pytest.raises(EnvError, match="cannot import module 'no_such_module_xyz'"):
        vime.make("no_such_module_xyz:acme/Echo-v0")


def test_plugins_register_through_the_entry_point_group(plugin_path):
    with pytest.warns(UserWarning, match="env plugin 'broken'.*libfoo"):
        errors = dict(registry.load_plugins(force=True))
    assert {"acme/Echo-v0", "acme/Echo-v1"} <= set(registry.env_ids())
    assert vime.make("acme/Echo-v0").greeting == "say something"
    assert vime.make("acme/Echo-v1").greeting == "hello from a callable"
    assert sorted(errors) == ["a_class", "broken"]
    assert "ImportError: acme_broken needs libfoo" in errors["broken"]
    assert "acme_envs:Echo is a class; the entry point must name a module" in errors["a_class"]


def test_a_failed_plugin_is_named_when_its_env_is_missing(plugin_path):
    with pytest.warns(UserWarning):
        registry.load_plugins(force=True)
    with pytest.raises(EnvError, match="Plugin 'broken' failed to load"):
        vime.make("acme/Missing-v0")


def test_gymnasium_make_works_after_import_vime_alone():
    # a fresh interpreter: nothing else has imported vime.envs
    code = (
        "import gymnasium, vime\n"
        "env = gymnasium.make('vime/Math-v0')\n"
        "print(type(env.unwrapped).__name__, sorted(i for i in gymnasium.registry if i.startswith('vime/')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(" ", 1)[0] == "MathEnv"
    for env_id in ("vime/Code-v0", "vime/GuessNumber-v0", "vime/Math-v0", "vime/MathTool-v0"):
        assert env_id in result.stdout
