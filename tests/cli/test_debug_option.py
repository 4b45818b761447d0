"""The --debug flag every leaf command takes is built with whichever parameter factory the installed typer
has: ``_get_param`` (typer >= 0.2x) or ``get_click_param`` returning (param, convertor) before it. The
private function used earlier is absent from the typer of a CUDA image, where every command failed."""
from __future__ import annotations

import typer.main as tm

from scaleplan.cli import _common


def _check(opt) -> None:
    assert opt.opts == ["--debug"] and opt.is_flag and opt.is_eager
    assert opt.expose_value is False and opt.callback is _common.set_debug and opt.default is False


def test_debug_option_with_this_typer():
    _check(_common.debug_option())


def test_debug_option_with_a_typer_that_has_only_get_click_param(monkeypatch):
    old = getattr(tm, "get_click_param", None)
    real = getattr(tm, "_get_param", None) or (lambda meta: old(meta)[0])
    monkeypatch.delattr(tm, "_get_param", raising=False)
    monkeypatch.setattr(tm, "get_click_param", lambda meta: (real(meta), None), raising=False)
    _check(_common.debug_option())
