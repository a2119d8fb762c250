"""--bf16-weight-copy: the torch trainer's steps run on a bf16 copy of its float32 weights.

The reference is mixed-precision training as Micikevicius et al. (2018) define it: forward and
backward of a half-precision model, whose gradients are accumulated in float32 and applied to
float32 master weights. Here that model is the HF model itself cast to bf16, run without
autocast, in a trainer of its own.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
from trainer_data import config, make_batch

from vime.errors import ConfigError
from vime.training.torch_backend import TorchTrainer


def with_copy(model, **overrides) -> TorchTrainer:
    return TorchTrainer(config(model, dtype="bfloat16", bf16_weight_copy=True, **overrides))


def stacked_mlp(mlp, x):
    """A gated MLP whose gate and up projections are one matmul by the two weights stacked
    (as the copy runs them): ``[a, b] = x [W_gate; W_up]^T``, ``down(silu(a) * b)``."""
    both = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
    a, b = torch.nn.functional.linear(x, both).chunk(2, dim=-1)
    return mlp.down_proj(torch.nn.functional.silu(a) * b)


def pure_bf16(model, stacked: bool = True, **overrides) -> TorchTrainer:
    """The reference: the model's own parameters in bf16, no autocast; gradients of each
    micro-batch summed in float32 (``summed``), the model's own ``.grad`` left empty; its
    gated MLPs through :func:`stacked_mlp` unless ``stacked`` is False (LoRA-wrapped
    projections are not stacked by the copy)."""
    trainer = TorchTrainer(config(model, dtype="bfloat16", bf16_weight_copy=False, **overrides))
    with torch.no_grad():
        for p in trainer.model.parameters():  # buffers (RoPE's inv_freq) stay as they are
            p.data = p.data.to(torch.bfloat16)
    trainer._autocast = contextlib.nullcontext
    for module in trainer.model.modules():
        if stacked and type(module).__name__.endswith("MLP"):
            module.forward = types.MethodType(stacked_mlp, module)
    trainer.summed = {}
    for name, param in trainer.model.named_parameters():
        if not param.requires_grad:
            continue

        def add(p, name=name):
            total = trainer.summed.get(name)
            trainer.summed[name] = p.grad.float() if total is None else total + p.grad.float()
            p.grad = None

        param.register_post_accumulate_grad_hook(add)
    return trainer


def gradients_of_step(trainer: TorchTrainer, batch) -> tuple[dict, dict]:
    """One train step's metrics and the gradients its optimizer was given (not applied)."""
    seen: dict[str, torch.Tensor] = {}

    def capture() -> float:
        for name, p in trainer.model.named_parameters():
            if p.grad is not None:
                seen[name] = p.grad.detach().clone()
        seen.update(getattr(trainer, "summed", {}))
        trainer.optimizer.zero_grad(set_to_none=True)
        return 0.0

    trainer._optimizer_step = capture
    return trainer.train_step(batch), seen


@pytest.mark.parametrize("tokens_per_micro_batch", [4096, 64])
@pytest.mark.parametrize("model", ["tiny_llama", "untied_qwen3"])
def test_a_step_on_the_copy_is_a_bf16_models_step_with_float32_accumulation(
    model, tokens_per_micro_batch, request
):
    # tiny_llama ties its embeddings (one copy, two modules); 64 tokens: several micro-batches
    model = request.getfixturevalue(model)
    batch = make_batch(3, num_samples=6, vocab_size=384)
    mine = with_copy(model, max_tokens_per_micro_batch=tokens_per_micro_batch)
    ref = pure_bf16(model, max_tokens_per_micro_batch=tokens_per_micro_batch)
    got, grads = gradients_of_step(mine, batch)
    want, ref_grads = gradients_of_step(ref, batch)
    assert got["num_micro_batches"] == want["num_micro_batches"]
    assert (tokens_per_micro_batch == 64) == (got["num_micro_batches"] > 1)
    assert got["loss"] == want["loss"]
    names = [n for n, _ in mine.model.named_parameters()]
    assert sorted(grads) == sorted(ref_grads) == sorted(names)
    for name in names:
        assert grads[name].dtype == torch.float32
        assert torch.equal(grads[name], ref_grads[name]), name
    for a, b in zip(mine.step_logprobs(), ref.step_logprobs(), strict=True):
        assert torch.equal(a, b)


def test_the_weights_stay_float32_masters_and_the_copy_follows_each_step(untied_qwen3):
    batch = make_batch(4, num_samples=4)
    mine = with_copy(untied_qwen3)
    before = mine.compute_logprobs(batch)
    mine.train_step(make_batch(5, num_samples=4))
    masters = dict(mine.model.named_parameters())
    assert {p.dtype for p in masters.values()} == {torch.float32}
    exported = {n: t for b in mine.export_weights() for n, t in b}
    assert {t.dtype for t in exported.values()} == {torch.float32}
    after = mine.compute_logprobs(batch)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # the copy after the step: the stepped masters rounded to bf16, nothing else
    ref = pure_bf16(untied_qwen3)
    with torch.no_grad():
        for name, p in ref.model.named_parameters():
            p.copy_(masters[name])
    for a, b in zip(after, ref.compute_logprobs(batch), strict=True):
        assert torch.equal(a, b)


def test_it_differs_from_autocast_and_stays_close_to_float32(untied_qwen3):
    batch = make_batch(6, num_samples=4)
    fp32 = TorchTrainer(config(untied_qwen3)).compute_logprobs(batch)
    auto = TorchTrainer(config(untied_qwen3, dtype="bfloat16")).compute_logprobs(batch)
    copy = with_copy(untied_qwen3).compute_logprobs(batch)
    assert any(not torch.equal(a, b) for a, b in zip(auto, copy, strict=True))
    for a, b in zip(fp32, copy, strict=True):
        assert 0 < float((a - b).abs().max()) < 0.5


def test_recomputed_activations_see_the_copy(tiny_llama):
    batch = make_batch(7, num_samples=5)
    _, plain = gradients_of_step(with_copy(tiny_llama), batch)
    _, recomputed = gradients_of_step(with_copy(tiny_llama, gradient_checkpointing=True), batch)
    for name, grad in plain.items():
        assert torch.equal(grad, recomputed[name]), name


def test_a_loaded_checkpoint_refreshes_the_copy(untied_qwen3, tmp_path):
    batch = make_batch(8, num_samples=4)
    trained = with_copy(untied_qwen3)
    trained.train_step(make_batch(9, num_samples=4))
    trained.save(tmp_path / "ckpt")
    resumed = with_copy(untied_qwen3)
    untrained = resumed.compute_logprobs(batch)  # fills the copy from the initial weights
    resumed.load(tmp_path / "ckpt")
    loaded = resumed.compute_logprobs(batch)
    for a, b, c in zip(trained.compute_logprobs(batch), loaded, untrained, strict=True):
        assert torch.equal(a, b) and not torch.equal(b, c)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(backend="megatron", dtype="bfloat16"), "needs --backend torch"),
        (dict(dtype="float32"), "needs --backend torch and --dtype bfloat16"),
    ],
)
def test_configs_it_cannot_serve_are_refused(untied_qwen3, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(untied_qwen3, bf16_weight_copy=True, **overrides)


def test_auto_dtype_on_the_cpu_is_refused_by_the_trainer(untied_qwen3):
    with pytest.raises(ConfigError, match=r"auto is float32 on the CPU.*dtype float32"):
        TorchTrainer(config(untied_qwen3, bf16_weight_copy=True))


def test_the_flag_reaches_the_trainer_from_vime_train(untied_qwen3, tmp_path):
    from vime.cli.main import parse_args
    from vime.cli.train_cmd import build_setup

    argv = ["train", "--model", str(untied_qwen3), "--env", "vime/Math-v0"]
    argv += ["--output-dir", str(tmp_path), "--dtype", "bfloat16"]
    # Unset on the CPU: autocast, as the quickstart's measured runs had it.
    for extra, setting, on in (([], None, False), (["--bf16-weight-copy"], True, True),
                               (["--no-bf16-weight-copy"], False, False)):  # fmt: skip
        setup = build_setup(parse_args([*argv, *extra]))
        assert setup.trainer.bf16_weight_copy is setting
        trainer = TorchTrainer(setup.trainer, setup.loss)
        assert (trainer.weight_copy is not None) is on
        if on:  # every layer's gate and up projections share one copy
            layers = trainer.model.model.layers
            assert [m for m, _ in trainer.weight_copy._gate_up] == [x.mlp for x in layers]
    # --no-hf-swiglu-fusion keeps transformers' MLP, and its two projections
    setup = build_setup(parse_args([*argv, "--bf16-weight-copy", "--no-hf-swiglu-fusion"]))
    assert TorchTrainer(setup.trainer, setup.loss).weight_copy._gate_up == []


@pytest.mark.parametrize(
    ("setting", "device", "dtype", "processes", "on"),
    [
        (None, "cuda", "bfloat16", 1, True),  # the GPU default
        (None, "cuda", "bfloat16", 2, False),  # FSDP2's policy casts
        (None, "cuda", "float32", 1, False),
        (None, "cpu", "bfloat16", 1, False),  # the CPU keeps autocast unless asked
        (False, "cuda", "bfloat16", 1, False),
        (True, "cpu", "bfloat16", 1, True),
        (True, "cuda", "bfloat16", 2, True),  # asked for: the trainer then refuses it
    ],
)
def test_unset_means_on_for_bf16_on_one_gpu(setting, device, dtype, processes, on):
    from vime.training.torch_backend import wants_weight_copy

    assert wants_weight_copy(setting, device, dtype, processes) is on


def test_lora_trains_its_adapters_on_the_copy_of_the_frozen_base(tiny_llama):
    batch = make_batch(10, num_samples=5)
    lora = dict(lora_rank=4, lora_target_modules="q_proj,v_proj")
    mine = with_copy(tiny_llama, **lora)
    _, grads = gradients_of_step(mine, batch)
    _, ref_grads = gradients_of_step(pure_bf16(tiny_llama, **lora), batch)
    assert not hasattr(mine.model.model.layers[0].mlp, "_vime_gate_up")
    trainable = [n for n, p in mine.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)
    assert sorted(grads) == sorted(ref_grads) == sorted(trainable)
    for name in trainable:
        assert torch.equal(grads[name], ref_grads[name]), name


def test_the_fused_gate_up_projection_equals_the_two_projections_in_float32(
    untied_qwen3, monkeypatch
):
    """One matmul by the stacked gate/up copy against transformers' two, both in float32:
    the same loss and gradients up to the order of float32 sums."""
    from vime.training import hf_kernels
    from vime.training.weight_copy import WeightCopy

    model = TorchTrainer(config(untied_qwen3)).model
    mlps = hf_kernels.gate_up_modules(model)
    assert len(mlps) == model.config.num_hidden_layers
    gated = []
    monkeypatch.setattr(hf_kernels, "gated_silu", lambda y: gated.append(y.shape) or
                        torch.nn.functional.silu(y.chunk(2, -1)[0]) * y.chunk(2, -1)[1])  # fmt: skip
    ids = torch.randint(0, 384, (2, 24), generator=torch.Generator().manual_seed(0))
    runs = []
    for fused in (False, True):
        model.zero_grad(set_to_none=True)
        gated.clear()
        copy = WeightCopy(model, torch.float32, fuse_gate_up=mlps if fused else ())
        with copy.active():
            assert all(hasattr(m, "_vime_gate_up") == fused for m in mlps)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        assert not any(hasattr(m, "_vime_gate_up") for m in mlps)
        intermediate = model.config.intermediate_size
        assert gated == ([(2, 24, 2 * intermediate)] * len(mlps) if fused else [])
        runs.append(
            (float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()})
        )
    (loss0, g0), (loss1, g1) = runs
    assert abs(loss1 - loss0) < 1e-6 * abs(loss0)
    assert sorted(g0) == sorted(g1)
    for name, grad in g0.items():
        assert g1[name].dtype == torch.float32
        scale = float(grad.abs().max())
        assert float((g1[name] - grad).abs().max()) <= 1e-5 * scale, name


def test_lora_wrapped_gate_and_up_projections_are_not_fused(tiny_llama):
    batch = make_batch(11, num_samples=4)
    lora = dict(lora_rank=4, lora_target_modules="gate_proj,up_proj")
    mine = with_copy(tiny_llama, **lora)
    assert mine.weight_copy._gate_up == []
    _, grads = gradients_of_step(mine, batch)
    _, ref_grads = gradients_of_step(pure_bf16(tiny_llama, stacked=False, **lora), batch)
    assert sorted(grads) == sorted(ref_grads) and grads
    for name in grads:
        assert torch.equal(grads[name], ref_grads[name]), name


def _count_wgrad_gemms(monkeypatch) -> list[tuple[int, int]]:
    """The shapes of the weight gradients the copy's linears add straight into masters."""
    from vime.training import weight_copy

    calls: list[tuple[int, int]] = []
    accum, first = weight_copy.wgrad_gemm_accum_fp32, weight_copy.wgrad_gemm_fp32

    def counted_accum(total_input, grad_output, main_grad):
        assert main_grad.dtype == torch.float32
        calls.append(tuple(main_grad.shape))
        accum(total_input, grad_output, main_grad)

    def counted_first(total_input, grad_output):
        out = first(total_input, grad_output)
        assert out.dtype == torch.float32
        calls.append(tuple(out.shape))
        return out

    monkeypatch.setattr(weight_copy, "wgrad_gemm_accum_fp32", counted_accum)
    monkeypatch.setattr(weight_copy, "wgrad_gemm_fp32", counted_first)
    return calls


def test_linear_weight_gradients_go_straight_into_the_float32_masters(untied_qwen3, monkeypatch):
    """--hf-gradient-accumulation-fusion (on): every linear but the output layer adds its
    weight gradient into the master's .grad in its backward GEMM (the gate and up projections
    as the two halves of their stacked copy); the step's gradients are those of the hook path
    (--no-hf-gradient-accumulation-fusion) bit for bit on the CPU, which forms the product in
    bf16 either way."""
    batch = make_batch(11, num_samples=6, vocab_size=384)
    calls = _count_wgrad_gemms(monkeypatch)
    runs = {}
    for fused in (True, False):
        calls.clear()
        trainer = with_copy(untied_qwen3, max_tokens_per_micro_batch=64,
                            hf_gradient_accumulation_fusion=fused)  # fmt: skip
        metrics, grads = gradients_of_step(trainer, batch)
        runs[fused] = (metrics, grads)
        cfg = trainer.model.config
        layers, micro = cfg.num_hidden_layers, int(metrics["num_micro_batches"])
        h, i = cfg.hidden_size, cfg.intermediate_size
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        per_layer = sorted([(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)])
        assert micro > 1
        assert sorted(calls) == (sorted(per_layer * layers * micro) if fused else [])
        for m in trainer.model.modules():  # the class's forward again outside the step
            assert "forward" not in vars(m) or type(m) is not torch.nn.Linear
    (m1, g1), (m0, g0) = runs[True], runs[False]
    assert m1["loss"] == m0["loss"] and sorted(g1) == sorted(g0)
    for name, grad in g0.items():
        assert g1[name].dtype == torch.float32
        assert torch.equal(g1[name], grad), name


def test_straight_accumulation_equals_the_hook_path_in_float32(untied_qwen3):
    """A float32 copy: two micro-batches' gradients summed by the GEMM into the masters equal
    the copy's gradients added by the hook, up to the order of float32 sums."""
    from vime.training.weight_copy import WeightCopy

    model = TorchTrainer(config(untied_qwen3)).model
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m is not head]
    ids = [
        torch.randint(0, 384, (1, 20), generator=torch.Generator().manual_seed(s)) for s in (1, 2)
    ]
    runs = []
    for accumulate in (linears, []):
        model.zero_grad(set_to_none=True)
        copy = WeightCopy(model, torch.float32, accumulate_linears=accumulate)
        with copy.active():
            for x in ids:
                model(input_ids=x, labels=x).loss.backward()
        runs.append({n: p.grad.clone() for n, p in model.named_parameters()})
    fused, hooked = runs
    assert sorted(fused) == sorted(hooked)
    for name, grad in hooked.items():
        scale = float(grad.abs().max())
        assert float((fused[name] - grad).abs().max()) <= 1e-6 * scale, name


def test_the_accumulation_flag_reaches_the_copy_from_vime_train(untied_qwen3, tmp_path):
    from vime.cli.main import parse_args
    from vime.cli.train_cmd import build_setup

    argv = ["train", "--model", str(untied_qwen3), "--env", "vime/Math-v0", "--output-dir",
            str(tmp_path), "--dtype", "bfloat16", "--bf16-weight-copy"]  # fmt: skip
    for extra, count in (([], 7), (["--no-hf-gradient-accumulation-fusion"], 0)):
        setup = build_setup(parse_args([*argv, *extra]))
        assert setup.trainer.hf_gradient_accumulation_fusion is (count > 0)
        trainer = TorchTrainer(setup.trainer, setup.loss)
        layers = trainer.model.config.num_hidden_layers
        assert len(trainer.weight_copy._forwards) == count * layers
        assert len(trainer.weight_copy._gate_up_masters) == (layers if count else 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA's mixed-precision GEMM")
def test_on_cuda_the_gradient_is_summed_in_float32_without_a_bf16_rounding():
    """Two micro-batches through linear_into_masters: the master's gradient is the float32 sum
    of float32 products of the bf16 operands (not of bf16-rounded products), and the input's
    gradient is F.linear's."""
    from vime.training.weight_copy import linear_into_masters

    g = torch.Generator(device="cuda").manual_seed(0)
    master = torch.nn.Parameter(torch.randn(96, 64, device="cuda", generator=g))
    weight = master.detach().bfloat16().requires_grad_()
    xs = [torch.randn(2, 40, 64, device="cuda", generator=g).bfloat16() for _ in range(2)]
    dys = [torch.randn(2, 40, 96, device="cuda", generator=g).bfloat16() for _ in range(2)]
    for x, dy in zip(xs, dys, strict=True):
        x = x.requires_grad_()
        linear_into_masters(x, weight, None, [master]).backward(dy)
        assert torch.equal(x.grad, dy @ weight.detach())
    assert weight.grad is None and master.grad.dtype == torch.float32
    pairs = [(x.reshape(-1, 64), dy.reshape(-1, 96)) for x, dy in zip(xs, dys, strict=True)]
    exact = sum(dy.double().t() @ x.double() for x, dy in pairs)
    rounded = sum((dy.t() @ x).float() for x, dy in pairs)  # the hook path's bf16 products
    err = float((master.grad.double() - exact).abs().max())
    assert err <= 1e-5 * float(exact.abs().max())
    assert err < float((rounded.double() - exact).abs().max())
