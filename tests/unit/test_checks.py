"""hvdkeras._checks: the integer and finite-number checks of arguments, and a launcher's integer variables."""

import math

import pytest

from hvdkeras._checks import check_int, check_number, env_int


def test_check_int():
    assert check_int("n", 3) == 3 and check_int("n", None, allow_none=True) is None
    with pytest.raises(ValueError, match=r"`n` must be an integer >= 1. Received: n=0"):
        check_int("n", 0)
    with pytest.raises(TypeError, match=r"`b` must be an integer number of bytes in \[0, 4\) \(hint\). "
                                        r"Received: b=True"):
        check_int("b", True, 0, maximum=4, unit="bytes", hint="(hint)", error=TypeError)


@pytest.mark.parametrize("value", [-0.5, math.nan, math.inf, "1", None, True])
def test_check_number_refuses_what_is_not_a_finite_number_in_range(value):
    with pytest.raises(ValueError, match=rf"`x` must be a finite number >= 0. Received: x={value!r}"):
        check_number("x", value)


def test_check_number_bounds():
    assert check_number("x", 0) == 0.0 and check_number("x", 2, minimum=1) == 2.0
    with pytest.raises(ValueError, match=r"`f` must be a finite number > 0. Received: f=0"):
        check_number("f", 0, exclusive=True)
    with pytest.raises(ValueError, match=r"`e` must be a finite number of epochs >= 0"):
        check_number("e", -1, what="a number of epochs")


def test_env_int_reads_a_launchers_integer():
    assert env_int({"RANK": " 3 "}, "RANK") == 3 and env_int({}, "RANK", 7) == 7
    assert env_int({"RANK": ""}, "RANK") is None
    with pytest.raises(KeyError, match=r"RANK must be an integer >= 0. Received: RANK='x'"):
        env_int({"RANK": "x"}, "RANK", error=KeyError)
