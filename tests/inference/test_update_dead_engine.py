"""A weight update right after an engine died (before the supervisor noticed) updates the live
engines and leaves the dead one to load the same weights on its restart."""

from __future__ import annotations

import threading

import pytest

import vime.inference.service as service_mod
from vime.inference.config import ServeConfig
from vime.inference.errors import InferenceError
from vime.inference.service import Engine, InferenceService


class FakeProcess:
    def __init__(self, alive: bool) -> None:
        self.is_alive = alive

    def alive(self) -> bool:
        return self.is_alive


class RecordingUpdater:
    calls: list[list[str]] = []

    def __init__(self, mode: str) -> None:
        pass

    async def update(self, urls: list[str], folder: str, version: int):
        RecordingUpdater.calls.append(list(urls))
        return service_mod.UpdateReport(version=version, engines=list(urls))


@pytest.fixture
def service(tmp_path, monkeypatch) -> InferenceService:
    RecordingUpdater.calls = []
    monkeypatch.setattr(service_mod, "WeightUpdater", RecordingUpdater)
    svc = InferenceService(ServeConfig(model="m", log_dir=str(tmp_path), engine_start_timeout=5))
    svc.engines = [
        Engine(0, "http://a", FakeProcess(alive=True), healthy=True),
        Engine(1, "http://b", FakeProcess(alive=False), healthy=True),  # died a moment ago
    ]
    return svc


def test_an_engine_that_just_died_is_left_out_of_the_update(service) -> None:
    report = service.update_weights("/tmp/w1", 1)
    assert RecordingUpdater.calls == [["http://a"]] and report.engines == ["http://a"]
    assert service.weight_version == 1 and service._state.weights_folder == "/tmp/w1"


def test_with_every_engine_restarting_the_update_waits_for_one_to_be_back(service) -> None:
    service.engines[0].process.is_alive = False
    back = service.engines[1]

    def restarted() -> None:
        back.process.is_alive = True

    threading.Timer(0.5, restarted).start()
    report = service.update_weights("/tmp/w2", 2)
    # The restarted engine loads the folder itself (it is the service's newest one).
    assert RecordingUpdater.calls == [] and report.engines == []
    assert service._state.weights_folder == "/tmp/w2" and service.weight_version == 2


def test_no_engine_coming_back_is_an_error(service) -> None:
    for e in service.engines:
        e.process.is_alive = False
    with pytest.raises(InferenceError, match="no engine is running and none came back"):
        service.update_weights("/tmp/w3", 3)


def test_an_engine_dying_during_the_update_is_left_out_on_a_second_try(service) -> None:
    service.engines[1].process.is_alive = True
    dying = service.engines[1]

    class DropsB(RecordingUpdater):
        async def update(self, urls, folder, version):
            RecordingUpdater.calls.append(list(urls))
            if "http://b" in urls:  # its connection drops before its process is seen dead
                threading.Timer(0.3, setattr, (dying.process, "is_alive", False)).start()
                raise InferenceError("weight update: pause (wait) on http://b failed: ReadError")
            return service_mod.UpdateReport(version=version, engines=list(urls))

    service_mod.WeightUpdater = DropsB
    report = service.update_weights("/tmp/w4", 4)
    assert RecordingUpdater.calls == [["http://a", "http://b"], ["http://a"]]
    assert report.engines == ["http://a"] and service.weight_version == 4


def test_a_failure_with_every_engine_alive_is_raised(service) -> None:
    service.engines[1].process.is_alive = True

    class Fails(RecordingUpdater):
        async def update(self, urls, folder, version):
            raise InferenceError("weight update: load weights on http://a failed: 500")

    service_mod.WeightUpdater = Fails
    with pytest.raises(InferenceError, match="load weights on http://a failed"):
        service.update_weights("/tmp/w5", 5)
