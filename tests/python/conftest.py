"""Shared fixtures: every test starts with no compiled entries and the default config."""
import pytest
import torch

import kiln


@pytest.fixture(autouse=True)
def _fresh_kiln():
    kiln.reset()
    saved = (kiln.config.debug, kiln.config.cache_size_limit, kiln.config.log)
    torch.manual_seed(0)
    yield
    kiln.config.debug, kiln.config.cache_size_limit, kiln.config.log = saved
    kiln.reset()
