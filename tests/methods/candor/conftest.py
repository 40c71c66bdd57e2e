"""Shared fixtures of the CANDOR tests."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Matrices of a few hundred to a few thousand rows: extra torch threads only contend on a
    loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
