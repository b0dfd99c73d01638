"""The development database helper (pgmsg_dev, not shipped): names reach psql only if plain."""

import pytest

from pgmsg.core import errors
from pgmsg_dev import devdb


@pytest.mark.parametrize("name", ["x'; DROP DATABASE pgmsg; --", 'a"b', "Upper", "", "9lives"])
def test_a_database_name_that_is_not_a_plain_identifier_is_refused(tmp_path, name):
    with pytest.raises(errors.ConfigurationError, match="lower-case letters, digits and _"):
        devdb.embedded_database_url(tmp_path / "never-made", name=name)
    assert not (tmp_path / "never-made").exists()  # refused before any server starts
