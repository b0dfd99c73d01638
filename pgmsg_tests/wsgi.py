"""The WSGI application of the test project, for tests that serve it under gunicorn."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pgmsg_tests.settings")
application = get_wsgi_application()
