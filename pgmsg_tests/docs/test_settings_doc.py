"""docs/settings.md lists every setting of pgmsg/core/conf.py, with its type and default."""

from __future__ import annotations

import dataclasses
import re

from pgmsg.core import conf
from pgmsg_tests.conftest import ROOT

DOC = ROOT / "docs" / "settings.md"
ROW = re.compile(r"^\| `(\w+)` \| `(.+?)` \| `(.+?)` \| (.+) \|$", re.M)


def rows() -> dict[str, tuple[str, str]]:
    return {
        name: (kind.replace("\\|", "|"), default)
        for name, kind, default, _ in ROW.findall(DOC.read_text())
    }


def test_every_setting_has_one_row_with_its_type_and_default():
    documented = rows()
    fields = dataclasses.fields(conf.Settings)
    assert sorted(documented) == sorted(f.name for f in fields)
    defaults = conf.Settings()
    for field in fields:
        kind, default = documented[field.name]
        assert kind == field.type, field.name
        assert default == repr(getattr(defaults, field.name)), field.name


def test_the_readme_and_the_channels_guide_link_the_reference():
    assert "docs/settings.md" in (ROOT / "README.md").read_text()
    assert "settings.md" in (ROOT / "docs" / "channels.md").read_text()
