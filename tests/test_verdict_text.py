"""verdict.json's text: the document json.dumps would write, a unit to a line."""

import json
import math

from hypothesis import given, settings, strategies as st

from ckptaudit.stages.report import json_text

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                       max_leaves=20)


def test_each_unit_is_one_line_and_the_rest_is_indented():
    doc = {"schema": "ckptaudit.verdict/1", "rollback": {"unit": "ckpt_2.pt", "step": 2}, "alternatives": [],
           "units": [{"unit": "ckpt_1.pt", "step": 1, "findings": [{"kind": "nonfinite_tensor", "detail": {"n": 1}}]},
                     {"unit": "ckpt_2.pt", "step": 2, "findings": []}],
           "loss": math.inf}
    text = json_text(doc)
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and text.endswith("}\n")
    assert '    {"unit": "ckpt_1.pt", "step": 1, "findings": [{"kind": "nonfinite_tensor", "detail": {"n": 1}}]},' in lines
    assert '    {"unit": "ckpt_2.pt", "step": 2, "findings": []}' in lines
    assert lines[1:3] == ['  "schema": "ckptaudit.verdict/1",', '  "rollback": {']
    assert '  "alternatives": [],' in lines
    assert json.loads(text) == doc
    assert json_text({}) == "{}\n"


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _values, max_size=6))
def test_the_same_document_as_json_dumps(doc):
    assert json.loads(json_text(doc)) == json.loads(json.dumps(doc, indent=2))
    assert list(json.loads(json_text(doc))) == list(doc)
