"""Object names rgpu derives from server names and identities stay valid and distinct."""

from __future__ import annotations

from rgpu_contracts import prefixed_name


def test_a_short_name_is_kept_as_it_is() -> None:
    assert prefixed_name("rgpu-", "gpu-node-1") == "rgpu-gpu-node-1"


def test_long_names_fit_in_63_characters_and_never_collide() -> None:
    base = "gpu-node-" + "x" * 80
    first, second = prefixed_name("lupine-", base + "-a"), prefixed_name("lupine-", base + "-b")
    assert len(first) <= 63 and len(second) <= 63
    assert first != second
    assert first.startswith("lupine-gpu-node-xxx")


def test_a_cut_never_ends_the_readable_part_with_a_dot_or_dash() -> None:
    name = prefixed_name("rgpu-", "a" * 47 + "." + "b" * 40)
    readable = name.rsplit("-", 1)[0]
    assert not readable.endswith((".", "-"))


def test_an_instance_server_name_becomes_a_valid_distinct_object_name() -> None:
    name = prefixed_name("rgpu-", "gpu-a@14834")
    assert len(name) <= 63 and "@" not in name
    assert name.startswith("rgpu-gpu-a-14834-")
    # A Node literally named like the readable part keeps its own, unhashed Lease name.
    assert name != prefixed_name("rgpu-", "gpu-a-14834")
