from __future__ import annotations

import pytest

from rgpu_discovery.errors import BadPollParameter, NotListedYet
from rgpu_discovery.polling import DEFAULT_WAIT_SECONDS, Poll, answer
from rgpu_discovery.published import Published
from rgpu_runtime import Versioned

pytestmark = pytest.mark.anyio


def test_no_parameters_mean_answer_now() -> None:
    assert Poll.from_query({}) == Poll(since=None, wait=0.0)


def test_since_without_wait_waits_the_default() -> None:
    assert Poll.from_query({"since": "5"}) == Poll(since=5, wait=DEFAULT_WAIT_SECONDS)


def test_since_and_wait_are_read() -> None:
    assert Poll.from_query({"since": "0", "wait": "2.5"}) == Poll(since=0, wait=2.5)


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ({"since": "-1"}, "since"),
        ({"since": "abc"}, "since"),
        ({"since": "1.5"}, "since"),
        ({"since": ""}, "since"),
        ({"since": "1", "wait": "61"}, "wait"),
        ({"since": "1", "wait": "-0.1"}, "wait"),
        ({"since": "1", "wait": "soon"}, "wait"),
        ({"since": "1", "wait": "nan"}, "wait"),
        ({"wait": "5"}, "wait"),
    ],
)
def test_bad_parameter_is_named(query: dict[str, str], parameter: str) -> None:
    with pytest.raises(BadPollParameter) as caught:
        Poll.from_query(query)
    assert caught.value.parameter == parameter
    assert caught.value.status_code == 400
    assert repr(parameter) in caught.value.message


def _versioned(listed: bool) -> Versioned[Published[int]]:
    empty = Published[int](revision=3, listed=listed, key="x", fields={}, items=())
    return Versioned(empty, revision=3)


async def test_unlisted_state_answers_503() -> None:
    with pytest.raises(NotListedYet) as caught:
        await answer(_versioned(False), Poll(), "fleet")
    assert caught.value.status_code == 503
    assert caught.value.retryable


async def test_since_other_than_current_answers_at_once() -> None:
    snapshot = await answer(_versioned(True), Poll(since=2, wait=30), "fleet")
    assert snapshot.revision == 3
