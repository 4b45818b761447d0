"""The search as one call (scaleplan.mosaic.run): request checks before any work, and the CLI's shared list
parsing (scaleplan.cli._common.int_list / float_list) that builds the request."""
import pytest

from scaleplan.cli._common import float_list, int_list
from scaleplan.errors import SpecError
from scaleplan.mosaic.run import SearchRequest, check_request


@pytest.mark.parametrize("kw, field", [
    ({"nodes": (4, 8), "days": (10.0, 20.0)}, "--nodes/--days"),
    ({"optimizer": "lion"}, "--optimizer"),
    ({"s_min": 0.9, "s_max": 0.8}, "--s-max"),
    ({"samples": -1}, "--samples"),
    ({"top": 0}, "--top"),
    ({"mem_fraction": 1.5}, "--mem-fraction"),
    ({"workers": -2}, "--workers"),
])
def test_check_request_names_the_option(kw, field):
    req = SearchRequest(**{"profile": "p6-b200.48xlarge", "nodes": (4,), "days": (10.0,), **kw})
    with pytest.raises(SpecError) as e:
        check_request(req)
    assert e.value.field == field


def test_a_sweep_over_one_axis_is_accepted():
    check_request(SearchRequest(profile="p6-b200.48xlarge", nodes=(4, 8, 16), days=(10.0,)))


def test_list_options_parse_and_refuse_with_the_flag():
    assert int_list("--q", "8, 10,12") == (8, 10, 12)
    assert float_list("--days", "10,20.5") == (10.0, 20.5)
    assert int_list("--vpp", None) is None
    for bad in ("8,x", "0,2", "", "-1"):
        with pytest.raises(SpecError) as e:
            int_list("--mbs", bad)
        assert e.value.field == "--mbs"
