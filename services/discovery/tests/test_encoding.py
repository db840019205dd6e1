from __future__ import annotations

import pytest

from rgpu_discovery.encoding import accepts_gzip


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        (None, False),
        ("", False),
        ("identity", False),
        ("gzip", True),
        ("GZip, deflate, br", True),
        ("deflate, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("*", True),
        ("*;q=0, gzip", True),
        ("gzip;q=0, *", False),
        ("x-gzip", True),
        ("gzip;q=nonsense", True),
    ],
)
def test_gzip_is_used_only_when_the_client_accepts_it(header: str | None, accepted: bool) -> None:
    assert accepts_gzip(header) is accepted
