"""Python containers mutated around graph breaks. A list, dict or set that a frame did not
build (an argument, or a local carried into a resume function) is "from outside": calling a
mutating method on it is a call kiln does not trace (a graph break whose instruction runs in
Python), storing into it runs the frame eagerly. Either way the mutation must happen exactly as
in eager Python."""
import pytest
import torch

from .harness import Corpus, t

corpus = Corpus()


@corpus((3,), frames=1, breaks=1)
def extend_local_list_after_break(x):
    outs = [x]
    print("corpus: extend")
    outs.extend([x + 1])
    return outs


@corpus((3,), frames=1, breaks=1)
def insert_into_local_list_after_break(x):
    outs = [x]
    print("corpus: insert")
    outs.insert(0, x + 1)
    return outs


@corpus((3,), frames=1, breaks=1)
def pop_from_local_list_after_break(x):
    outs = [x, x + 1]
    print("corpus: pop")
    last = outs.pop()
    return outs, last


@corpus((3,), frames=0, breaks=1)
def clear_local_list_after_break(x):
    outs = [x]
    print("corpus: clear")
    outs.clear()
    return outs


@corpus((3,), frames=1, breaks=2)
def sort_and_reverse_int_list_after_break(x):
    order = [3, 1, 2]
    print("corpus: sort")
    order.sort()
    order.reverse()
    return x * order[0], order


@corpus((3,), frames=0, breaks=1)
def append_through_an_alias_after_break(x):
    a = []
    b = a
    print("corpus: alias")
    a.append(x)
    return b


@corpus((3,), frames=1, breaks=1)
def append_to_inner_list_after_break(x):
    rows = [[x]]
    print("corpus: rows")
    rows[0].append(x + 1)
    return rows


@corpus((3,), lambda: {"a": [t(3)]}, frames=1, breaks=0)
def append_to_list_inside_dict_argument(x, d):
    d["a"].append(x)
    return x + 1


@corpus(lambda: torch.ones(3), frames=2, breaks=1)
def append_in_branch_on_tensor_value(x):
    outs = [x]
    if x.sum() > 0:
        outs.append(x * 2)
    return outs


@corpus(lambda: torch.ones(3), frames=2, breaks=1)
def append_after_item(x):
    outs = []
    for i in range(2):
        outs.append(x * i)
    v = x.sum().item()
    outs.append(x * v)
    return outs


@corpus((3,), frames=1, breaks=1)
def list_returned_twice_after_append(x):
    outs = [x]
    print("corpus: twice")
    outs.append(x + 1)
    return outs, outs


@corpus((3,), frames=1, breaks=1)
def append_to_list_in_local_dict_after_break(x):
    o = {"buf": []}
    o["buf"].append(x)
    print("corpus: buffer")
    o["buf"].append(x + 1)
    return o


def _append_print_append(outs, x):
    outs.append(x)
    print("corpus: callee")
    outs.append(x * 2)


# The callee breaks, so the root breaks at the call; in the callee's own frame `outs` is from
# outside: the first append is replayed before its print (a break), the second after x * 2.
@corpus((3,), frames=1, breaks=2)
def callee_appends_around_its_break(x):
    outs = []
    _append_print_append(outs, x)
    return outs


# The set is rebuilt as a set for the resume function, which then runs eagerly: a set from
# outside the frame is not modelled, so `seen.add` there is unsupported (no graph has an op).
@corpus((3,), frames=0, breaks=2)
def add_to_local_set_after_break(x):
    seen = {1}
    print("corpus: set")
    seen.add(2)
    return x * len(seen)


# These are right today: kept so they stay right.


def _append_one(outs, x):
    outs.append(x + 1)


@corpus((3,), frames=1, breaks=1)
def callee_appends_to_root_list_then_root_breaks(x):
    outs = []
    _append_one(outs, x)
    print("corpus: after callee")
    return outs


@corpus((3,), frames=2, breaks=1)
def store_into_local_list_after_break(x):
    outs = [x, x + 1]
    print("corpus: setitem")
    outs[0] = x * 5
    return outs


@corpus((3,), frames=1, breaks=1)
def store_into_local_dict_after_break(x):
    d = {}
    print("corpus: dict setitem")
    d["k"] = x * 5
    return d


@corpus((3,), frames=1, breaks=1)
def dict_update_after_break(x):
    d = {"a": x}
    print("corpus: update")
    d.update({"b": x + 1})
    return d


@corpus((3,), frames=2, breaks=1)
def tuple_carried_across_break(x):
    pair = (x + 1, x + 2)
    print("corpus: tuple")
    return pair[0] * pair[1]


@corpus((3,), lambda: [t(3)], frames=1, breaks=1)
def list_argument_read_after_break(x, xs):
    print("corpus: read")
    return xs[0] + x


@pytest.mark.parametrize("case", corpus.cases)
def test_program(case):
    case.run()
