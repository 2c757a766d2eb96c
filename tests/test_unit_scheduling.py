"""How `make unit` shares the suite among its pytest-xdist workers (tests/conftest.py): whole modules, but the tests
of the spread modules one by one, and the slow modules first."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import conftest
from conftest import ROOT, RUN_WITH, SLOW_MODULES, SPREAD_MODULES, unit_of_work


def test_the_listed_modules_exist():
    for module in {*SPREAD_MODULES, *SLOW_MODULES, *RUN_WITH, *RUN_WITH.values()}:
        assert (ROOT / module).is_file(), f"{module} is listed in tests/conftest.py but does not exist"
    assert set(SPREAD_MODULES) <= set(SLOW_MODULES)


def test_a_spread_module_is_shared_test_by_test_and_any_other_module_stays_whole():
    spread = SPREAD_MODULES[0]
    assert unit_of_work(f"{spread}::test_a") != unit_of_work(f"{spread}::test_b")
    assert unit_of_work(f"{spread}::test_a[x::y]") == f"{spread}::test_a[x::y]"
    whole = "tests/test_settings.py"
    assert unit_of_work(f"{whole}::test_a") == unit_of_work(f"{whole}::test_b[dev]") == whole


def test_modules_that_share_a_session_head_are_one_unit():
    """test_ray_token_auth.py and test_ray_2_55_1.py share the v0.7.0 head: on two workers it would start twice."""
    token, v070 = "tests/jobs/test_ray_token_auth.py", "tests/jobs/test_ray_2_55_1.py"
    assert unit_of_work(f"{token}::test_a[x]") == unit_of_work(f"{v070}::test_b") == v070


def test_slow_modules_come_first_and_modules_stay_together_in_order():
    ids = ["tests/test_a.py::t1", "tests/test_a.py::t2", f"{SLOW_MODULES[1]}::t", f"{SLOW_MODULES[0]}::t1",
           "tests/test_b.py::t", f"{SLOW_MODULES[0]}::t2"]  # fmt: skip
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    conftest.pytest_collection_modifyitems(cast(Any, None), cast(Any, items))
    assert [item.nodeid for item in items] == [
        f"{SLOW_MODULES[0]}::t1", f"{SLOW_MODULES[0]}::t2", f"{SLOW_MODULES[1]}::t",
        "tests/test_a.py::t1", "tests/test_a.py::t2", "tests/test_b.py::t",
    ]  # fmt: skip
