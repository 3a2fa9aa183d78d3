"""The batch commands' counts read as English."""

from token_finalizer.cli.batch.wording import counted


def test_one_is_singular() -> None:
    """Exactly one thing is counted without a plural s."""
    assert counted(1, "line") == "1 line"


def test_zero_and_many_are_plural() -> None:
    """Zero and several things take the plural."""
    assert (counted(0, "bad line"), counted(7, "line")) == ("0 bad lines", "7 lines")
