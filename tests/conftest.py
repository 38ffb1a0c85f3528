"""Fixtures a test module asks for by name (``pytestmark = pytest.mark.usefixtures("one_thread")``), and
the device the device-aware tests run on: ``pytest --device cuda`` (or ``CRATE_COMPOSE_TEST_DEVICE=cuda``)
runs every primitive against float32 and the half types, the fast paths against their formulas, and
training with its exact resume on that device; the default is the CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

DEVICE_VARIABLE = "CRATE_COMPOSE_TEST_DEVICE"


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default=os.environ.get(DEVICE_VARIABLE, "cpu"),
        help=f"device of the device-aware tests: cpu, cuda, cuda:1, ... (default: ${DEVICE_VARIABLE} or cpu)",
    )


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # make test: one process per core (pytest -n 2), one thread each,
        torch.set_num_threads(1)  # so the workers do not take each other's cores
    try:
        chosen = torch.device(config.getoption("--device"))
    except RuntimeError as error:
        raise pytest.UsageError(f"--device {config.getoption('--device')}: {error}") from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--device {chosen}: this torch sees no CUDA device")


def pytest_report_header(config):
    return f"crate-compose test device: {config.getoption('--device')}"


@pytest.fixture(scope="session")
def device(request) -> torch.device:
    """The device the device-aware tests put their modules and tensors on (``--device``)."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one thread avoids the cost of waking others (tens of ms per op on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh, empty data home (``$CRATE_COMPOSE_DATA``) for the tests of fetched sets and their caches."""
    folder = tmp_path / "data-home"
    monkeypatch.setenv("CRATE_COMPOSE_DATA", str(folder))
    return folder
