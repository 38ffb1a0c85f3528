"""Fixtures a test module asks for by name (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one thread avoids the cost of waking others (tens of ms per op on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
