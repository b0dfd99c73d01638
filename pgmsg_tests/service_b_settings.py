"""Service B of the HTTP proof (pgmsg_tests/test_two_services_http.py): the test project plus
B's inbox app, on a database of its own (DATABASE_URL), receiving A's webhooks."""

import json
import os

from pgmsg_tests.settings import *  # noqa: F403
from pgmsg_tests.settings import DATABASES, INSTALLED_APPS, PGMSG

INSTALLED_APPS = [*INSTALLED_APPS, "pgmsg_tests.testapp.service_b"]
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
# A receiver that opens a database connection per request spends most of its time there
# (measured: 169 against 1,686 raw INSERTs/s): gunicorn's workers keep theirs. No
# CONN_HEALTH_CHECKS: its SELECT 1 is a second round trip per request; a connection that
# died fails one request (503, the sender tries again) and Django drops it.
DATABASES["default"]["CONN_MAX_AGE"] = None

#: A's HTTP destination signs with this secret (PGMSG_TEST_SETTINGS of A's relay).
SECRET = os.environ.get("PGMSG_PROOF_SECRET", "outbox-test-secret")
PGMSG = {
    **PGMSG,
    "WEBHOOKS": {
        "from_a": {
            "inbox": "proof.http",
            "secret": SECRET,
            "max_body": int(os.environ.get("PGMSG_PROOF_MAX_BODY", "4096")),
        }
    },
    **json.loads(os.environ.get("PGMSG_TEST_SETTINGS_B", "{}")),
}
