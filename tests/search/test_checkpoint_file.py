"""The search checkpoint file: a round trip, and clear errors naming the file for what cannot be read."""

from __future__ import annotations

import pytest

from rankitect.errors import UserError
from rankitect.search.running.checkpoint import SearchState, load_state, save_state


def test_a_saved_state_loads_back(tmp_path) -> None:
    state = SearchState(parent_run_id="abc", config={"search": {"trials": 3}}, elapsed=12.5, done=True,
                        plan=[{"blocks": []}], identity={"data": "x"})
    save_state(tmp_path / "state.json", state)
    back = load_state(tmp_path / "state.json")
    assert back.to_dict() == state.to_dict()


@pytest.mark.parametrize("text, says", [
    (None, "search checkpoint not found"),
    ("{not json", "not a readable search checkpoint"),
    ('{"version": 99}', "search checkpoint version 99 is not"),
    ("[" * 200_000 + "]" * 200_000, "nested too deep"),  # past the JSON parser's own recursion limit
])
def test_an_unreadable_state_is_an_error_naming_the_file(tmp_path, text, says) -> None:
    path = tmp_path / "state.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError, match=says) as err:
        load_state(path)
    assert str(err.value).startswith(str(path))
