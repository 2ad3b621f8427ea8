"""The demo's closing sentence is computed from the run: a saving when blend was faster, the
plain fact when it was not."""

from blendrag_demo.run import _saving


def test_a_faster_blend_states_what_it_saved():
    text = _saving("preview@20%", full=1.0, blend=0.4)
    assert "saved 600 ms a question (60% of the full prefill)" in text


def test_a_slower_blend_says_so():
    text = _saving("preview@20%", full=0.1, blend=0.25)
    assert text.startswith("preview@20% was 150 ms slower than full here")
    assert "saved" not in text
