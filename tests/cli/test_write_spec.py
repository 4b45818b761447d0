"""write_spec reads what it wrote back before a command reports the file."""
from pathlib import Path

import pytest
import yaml
from scaleplan.emit import write_spec
from scaleplan.errors import SpecError


def test_a_written_spec_reads_back_with_its_header(tmp_path):
    doc = {"model": {"n_layers": 48, "n_experts": 128}, "data": {"gbs": 1024}}
    p = write_spec(tmp_path / "s.yaml", doc, "made by a test\nsecond line")
    text = p.read_text()
    assert text.startswith("# made by a test\n# second line\n")
    assert yaml.safe_load(text) == doc


def test_a_file_that_does_not_read_back_is_refused_naming_the_flag(tmp_path, monkeypatch):
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: "model: {}\n")  # another writer won the race
    with pytest.raises(SpecError) as e:
        write_spec(tmp_path / "s.yaml", {"model": {"n_layers": 2}}, flag="--output")
    assert "--output" in str(e.value) and "reads back" in str(e.value)
