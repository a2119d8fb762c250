"""`vime train` flag composition: one typed config per component, clear errors, dry runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vime.cli.main import main, parse_args
from vime.cli.train_cmd import build_setup
from vime.errors import ConfigError


def setup_of(*argv: str):
    return build_setup(parse_args(["train", "--model", "m", "--env", "vime/Math-v0", *argv]))


def test_one_flag_sets_every_component_that_shares_it() -> None:
    s = setup_of("--seed", "7", "--temperature", "0.7", "--vllm-max-model-len", "512")
    assert (s.run.seed, s.rollout.seed, s.trainer.seed) == (7, 7, 7)
    assert s.trainer.rollout_temperature == 0.7  # the trainer divides logits by it
    assert s.trainer.hf_checkpoint == s.serve.model == "m"
    assert s.serve.vllm_args == ["--max-model-len", "512"]
    assert (s.sampling.temperature, s.sampling.max_tokens) == (0.7, 256)


def test_the_model_path_is_stored_once_and_seen_by_trainer_and_engines() -> None:
    s = setup_of().with_model("/resolved/m")
    assert s.run.model == s.trainer.hf_checkpoint == s.serve.model == "/resolved/m"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("--rollout-temperature", "--temperature"),
        ("--rollout-top-p", "--top-p"),
        ("--rollout-max-response-len", "--max-tokens"),
    ],
)
def test_renamed_sampling_flags_name_their_new_spelling(old: str, new: str) -> None:
    with pytest.raises(ConfigError, match=f"{old} was renamed {new}.*use {new} 0.5"):
        setup_of(old, "0.5")


def test_greedy_sampling_cannot_train() -> None:
    with pytest.raises(ConfigError, match=r"--temperature must be > 0 for training, got 0\.0"):
        setup_of("--temperature", "0")


def test_help_names_the_trainer_backend_flag_as_it_is_spelled(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--backend megatron" in out and "--train-backend" not in out


def test_component_flags_land_in_their_typed_configs() -> None:
    s = setup_of(
        "--lr",
        "3e-6",
        "--n",
        "8",
        "--eps-clip-high",
        "0.28",
        "--advantage-estimator",
        "rloo",
        "--max-turns",
        "4",
    )
    assert s.trainer.lr == 3e-6 and s.rollout.n == 8 and s.agent.max_turns == 4
    assert s.loss.eps_clip_high == 0.28 and s.advantage.advantage_estimator == "rloo"


def test_async_mode_turns_on_off_policy_correction_by_default() -> None:
    assert setup_of("--mode", "async").loss.tis_cap == 2.0
    assert setup_of("--mode", "async", "--tis-cap", "5").loss.tis_cap == 5.0
    assert setup_of().loss.tis_cap is None


def test_megatron_flags_pass_through_only_with_the_megatron_backend() -> None:
    s = setup_of("--backend", "megatron", "--tensor-model-parallel-size", "2")
    assert s.megatron_args == ["--tensor-model-parallel-size", "2"]
    with pytest.raises(ConfigError, match="only with --backend megatron"):
        setup_of("--tensor-model-parallel-size", "2")


def test_contradictory_flags_are_refused() -> None:
    with pytest.raises(ConfigError, match="--mode async overlaps rollouts"):
        setup_of("--mode", "async", "--colocate")
    with pytest.raises(ConfigError, match="must equal --trainer-num-processes"):
        setup_of("--colocate", "--rollout-num-engines", "2").placement("CPU")


def test_unknown_flags_get_an_error_with_a_suggestion(capsys) -> None:
    assert main(["train", "--model", "m", "--env", "e", "--num-step", "3"]) == 2
    assert "Did you mean --num-steps" in capsys.readouterr().err


def test_quickstart_dry_run_prints_the_plan_and_starts_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "vime", "train", "--quickstart", "--dry-run", "--num-steps", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "env: vime/Math-v0, 4 tasks x 4 samples per step, 3 steps" in out.stdout
    assert "bundle 0: {CPU=1} <- engine 0 (tp rank 0)" in out.stdout


def test_env_kwargs_reach_the_env_factory_as_json() -> None:
    s = setup_of("--env-kwargs", '{"sandbox": "docker", "max_attempts": 4}')
    assert s.rollout.env_kwargs == {"sandbox": "docker", "max_attempts": 4}
    with pytest.raises(ConfigError, match="must be a JSON object"):
        setup_of("--env-kwargs", "[1]")
    with pytest.raises(ConfigError, match="not valid JSON"):
        setup_of("--env-kwargs", "{sandbox: docker}")


def test_the_weight_sync_writes_the_engines_dtype_not_fp32_masters(tmp_path, monkeypatch) -> None:
    import json

    from vime.cli.train_cmd import quickstart_configs
    from vime.orchestration.cluster import Cluster

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    # The quickstart preset on a bf16 CPU: bf16 engines (vllm.dtype), fp32 master weights.
    monkeypatch.setattr("vime.hardware.cpu_has_native_bf16", lambda: True)
    quick = build_setup(parse_args(["train", *quickstart_configs([])])).with_model(str(model))
    assert quick.trainer.dtype == "bfloat16" and Cluster(quick, "CPU").sync_dtype == "bfloat16"
    # An fp32 config and no --vllm-dtype: vLLM decides, the sync sends what the trainer has.
    plain = setup_of().with_model(str(model))
    assert Cluster(plain, "CPU").sync_dtype is None
    explicit = setup_of("--vllm-dtype", "float16").with_model(str(model))
    assert Cluster(explicit, "CPU").sync_dtype == "float16"


@pytest.mark.parametrize("native", [True, False])
def test_the_quickstart_computes_in_fp32_on_a_cpu_that_emulates_bf16(
    native: bool, tmp_path, monkeypatch, capsys
) -> None:
    import json

    from vime.cli.train_cmd import quickstart_configs
    from vime.orchestration.cluster import Cluster

    monkeypatch.setattr("vime.hardware.cpu_has_native_bf16", lambda: native)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))

    def quickstart(*argv: str):
        args = parse_args(["train", *quickstart_configs(list(argv)), *argv])
        return build_setup(args).with_model(str(model))

    want = "bfloat16" if native else "float32"
    cpu = quickstart("--device", "cpu")
    assert (cpu.trainer.dtype, Cluster(cpu, "CPU").sync_dtype) == (want, want)
    assert ("no native bf16 matmul" in capsys.readouterr().err) is not native
    # A GPU run keeps the preset's bf16, and a dtype on the command line wins over the overlay.
    assert quickstart("--device", "gpu").trainer.dtype == "bfloat16"
    asked = quickstart("--device", "cpu", "--dtype", "bfloat16", "--vllm-dtype", "bfloat16")
    assert (asked.trainer.dtype, Cluster(asked, "CPU").sync_dtype) == ("bfloat16", "bfloat16")


@pytest.mark.parametrize("native", [True, False])
def test_bf16_asked_of_a_cpu_that_emulates_it_is_warned_about(native, monkeypatch, caplog) -> None:
    from vime.orchestration.run import run_training

    monkeypatch.setattr("vime.hardware.cpu_has_native_bf16", lambda: native)
    flags = ("--dry-run", "--device", "cpu", "--env", "vime/Math-v0")
    run_training(setup_of(*flags, "--dtype", "bfloat16", "--vllm-dtype", "bfloat16"))
    warned = [r.getMessage() for r in caplog.records if "emulate" in r.getMessage()]
    assert len(warned) == (0 if native else 1)
    if not native:
        assert warned[0].startswith("--dtype and --vllm-dtype bfloat16 on a CPU without")
    caplog.clear()
    run_training(setup_of(*flags, "--dtype", "float32"))
    assert not [r for r in caplog.records if "emulate" in r.getMessage()]
