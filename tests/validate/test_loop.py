"""validate as one call (scaleplan.validate.loop): a bad request is refused before anything runs."""
from pathlib import Path

import pytest

from scaleplan.errors import SpecError
from scaleplan.validate.loop import BENCH_HINT, ValidateReport, ValidateRequest, check_request

TINY = Path(__file__).resolve().parents[1] / "data" / "validate_specs" / "tiny.yaml"


@pytest.mark.parametrize("kw, field", [
    ({"device": "tpu"}, "--device"),
    ({"nproc": 0}, "--nproc"),
    ({"html": Path("no_such_dir") / "r.html"}, "--html"),
])
def test_check_request_names_the_option(kw, field):
    with pytest.raises(SpecError) as e:
        check_request(ValidateRequest(spec=TINY, **kw))
    assert e.value.field == field


def test_the_hint_names_the_bench_plan_command():
    rep = ValidateReport(ValidateRequest(spec=TINY, nproc=2), "cpu-local")
    assert rep.hint == BENCH_HINT.format(spec=TINY, n=2, profile="cpu-local")
    assert f"bench plan {TINY} --devices 2 --run --profile cpu-local" in rep.hint
