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


def test_output_whose_class_overrides_to_tuple_is_built_in_the_graph():
    # CLIPOutput overrides to_tuple (flattening its nested outputs): its construction ran
    # ModelOutput's __setattr__ (super().__setitem__: a break in CLIP's forward). The class is
    # modelled, and its own to_tuple is inlined over the tracker.
    from transformers.modeling_outputs import BaseModelOutput
    from transformers.models.clip.modeling_clip import CLIPOutput

    def f(x):
        text = BaseModelOutput(last_hidden_state=x + 1)
        out = CLIPOutput(logits_per_image=x * 2, text_model_output=text)
        return (out.to_tuple(), list(out.keys()), out.text_model_output.last_hidden_state,
                out[1], out[:2])  # indexing reads the class's own to_tuple

    _check(f, torch.randn(2, 3))


def test_output_built_from_a_tuple_of_tensors_sets_its_first_field():
    # DETR's BackboneOutput(feature_maps=(...)): __post_init__ reads a non-tensor first field as
    # (key, value) pairs when it can; tensors are not pairs, so it is the field's value. An
    # empty tuple leaves the output empty.
    from transformers.modeling_outputs import BackboneOutput

    def f(x):
        out = BackboneOutput(feature_maps=(x, x * 2))
        empty = BackboneOutput(feature_maps=())
        return (out.feature_maps, list(out.keys()), out[0], len(empty), empty.feature_maps,
                list(empty.keys()))

    _check(f, torch.randn(2, 3))


def test_output_built_from_key_value_pairs_is_left_to_python():
    from transformers.modeling_outputs import BackboneOutput

    def f(x):
        return BackboneOutput(feature_maps=[("feature_maps", x * 2)])

    with pytest.raises(kiln.exc.Unsupported, match="non-tensor first field"):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(2))
