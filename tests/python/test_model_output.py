"""transformers' ModelOutput built inside a compiled frame: captured whole (fullgraph=True) and
rebuilt after the graph, with the semantics of the installed transformers (deprecated names of
renamed fields included), compared with eager."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")
from transformers.modeling_outputs import BaseModelOutputWithPast  # noqa: E402


def _same(got, want):
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    else:
        assert got == want


def _check(fn, *args):
    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    got, want = compiled(*args), fn(*args)
    _same(got, want)
    return got


def test_output_built_with_a_deprecated_keyword_matches_eager():
    # transformers >= 5.24 renames past_key_values= to its `cache` field when the output is
    # built; earlier versions have a past_key_values field. Either way compiled == eager.
    def f(x):
        out = BaseModelOutputWithPast(last_hidden_state=x * 2, past_key_values=(x + 1,))
        return (list(out.keys()), out.to_tuple(), "past_key_values" in out,
                out.get("past_key_values"), out["past_key_values"], out[1])

    _check(f, torch.randn(2, 3))


def test_output_returned_from_the_frame_is_the_eager_object():
    def f(x):
        return BaseModelOutputWithPast(last_hidden_state=x.sin(), past_key_values=(x.cos(),))

    x = torch.randn(4)
    got = kiln.compile(f, backend="eager", fullgraph=True)(x)
    want = f(x)
    assert type(got) is type(want)
    assert list(got.keys()) == list(want.keys())
    assert list(vars(got)) == list(vars(want))
    _same(got.to_tuple(), want.to_tuple())
    _same(got.past_key_values, want.past_key_values)


def test_item_assignment_under_a_deprecated_name_matches_eager():
    def f(x):
        out = BaseModelOutputWithPast(last_hidden_state=x)
        out["past_key_values"] = (x * 3,)
        return list(out.keys()), out.to_tuple()

    _check(f, torch.randn(3))


def test_output_missing_field_reads_its_default():
    def f(x):
        out = BaseModelOutputWithPast(last_hidden_state=x + 1)
        return out.hidden_states is None, len(out), out.to_tuple()

    _check(f, torch.randn(3))
