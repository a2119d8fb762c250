"""GPU weight-update path, run here without CUDA: vLLM's real trainer-side NCCL engine drives
Vime's EngineFanout against fake engines, with a recording stand-in for the NCCL group."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

pytest.importorskip("vllm")

from vime.inference.gpu_weights import EngineFanout, ExportedWeights, send_update


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict | None]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.url.host, request.url.path, body))
        return httpx.Response(200, json={})

    def paths(self) -> list[str]:
        return [p for _, p, _ in self.calls]


def _export() -> list[list[tuple[str, torch.Tensor]]]:
    return [
        [("model.embed_tokens.weight", torch.ones(8, 4))],
        [
            ("model.layers.0.mlp.up_proj.weight", torch.ones(6, 4)),
            ("model.norm.weight", torch.ones(4)),
        ],
    ]


def test_each_engine_gets_its_own_nccl_ranks() -> None:
    rec = Recorder()
    fanout = EngineFanout(
        ["http://e0:1", "http://e1:1"], tp_per_engine=2, transport=httpx.MockTransport(rec.handler)
    )
    assert fanout.world_size == 5
    fanout.init_weight_transfer_engine({"master_port": 7, "rank_offset": 1, "world_size": 5})
    offsets = {host: body["init_info"]["rank_offset"] for host, _, body in rec.calls}
    assert offsets == {"e0": 1, "e1": 3}


def test_exported_weights_match_metadata_and_pass_vllms_own_check() -> None:
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    source = ExportedWeights(_export)
    meta = source.metadata()
    assert [m.name for m in meta] == [n for b in _export() for n, _ in b]
    assert meta[1].shape == (6, 4) and meta[1].dtype == torch.float32
    checked = list(NCCLTrainerWeightTransferEngine._checked_iter(source, meta))
    assert [n for n, _ in checked] == [m.name for m in meta]
    assert source.groups() == [
        ["model.embed_tokens.weight"],
        ["model.layers.0.mlp.up_proj.weight"],
        ["model.norm.weight"],
    ]


def test_an_export_that_changes_between_passes_is_refused() -> None:
    passes = iter([_export(), [[("model.embed_tokens.weight", torch.ones(9, 4))]]])
    source = ExportedWeights(lambda: next(passes))
    source.metadata()
    with pytest.raises(ValueError, match="changed between passes at tensor 0"):
        list(source)


def test_vllm_nccl_trainer_engine_pauses_sends_stamps_the_version_and_resumes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    rec = Recorder()
    fanout = EngineFanout(
        ["http://e0:1", "http://e1:1"], mode="abort", transport=httpx.MockTransport(rec.handler)
    )
    sent: list[tuple[int, ...]] = []

    class FakeGroup:  # stands in for PyNcclCommunicator: records what would be broadcast
        def broadcast(self, tensor: torch.Tensor, src: int, stream: object) -> None:
            assert src == 0
            sent.append(tuple(tensor.shape))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda: None)
    engine = NCCLTrainerWeightTransferEngine(
        client=fanout, source=ExportedWeights(_export), is_sender=True, packed=False
    )
    engine.model_update_group = FakeGroup()
    send_update(engine, fanout, version=5)

    paths = rec.paths()
    assert (
        paths
        == ["/pause"] * 2
        + ["/start_weight_update"] * 2
        + ["/update_weights"] * 2
        + ["/finish_weight_update"] * 2
        + ["/resume"] * 2
    )
    assert all(
        body == {"weight_version": "5"} for _, p, body in rec.calls if p == "/finish_weight_update"
    )
    update = next(body for _, p, body in rec.calls if p == "/update_weights")["update_info"]
    assert update["names"] == [n for b in _export() for n, _ in b]
    assert update["dtype_names"] == ["float32"] * 3
    assert sent == [(8, 4), (6, 4), (4,)]


def test_sleep_and_wake_reach_every_engine() -> None:
    rec = Recorder()
    fanout = EngineFanout(
        ["http://e0:1", "http://e1:1"], transport=httpx.MockTransport(rec.handler)
    )
    fanout.sleep(level=1)
    fanout.wake_up(tags=["weights"])
    assert rec.paths() == ["/sleep", "/sleep", "/wake_up", "/wake_up"]
