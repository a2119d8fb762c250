"""The fault-injection harness (bench/faults.py) as a fixture; each test runs one case."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="session")
def faults():
    spec = importlib.util.spec_from_file_location("faults", BENCH / "faults.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["faults"] = module
    spec.loader.exec_module(module)
    return module
